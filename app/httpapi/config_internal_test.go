package httpapi

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// New reports every wrong field at once, each named.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	_, err := New(Config{RateLimit: RateLimit{PerSecond: -1}})
	for _, want := range []string{"httpapi config: ", "Service: is required", "Pool: is required", "RateLimit.PerSecond: must be a finite number"} {
		require.ErrorContains(t, err, want)
	}
}
