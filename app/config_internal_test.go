package app

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// NewService reports every missing field at once, each named.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	_, err := NewService(Config{})
	require.ErrorContains(t, err, "app config: ")
	require.ErrorContains(t, err, "Pool: is required")
	require.ErrorContains(t, err, "Events: is required")
}
