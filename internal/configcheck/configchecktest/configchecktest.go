// Package configchecktest runs a Config's validation table, the one shape
// of the validation tests of Outflow's Configs: defaults, then validate,
// then either no error (and the defaults a valid Config got) or one error
// that names every wrong field at once.
package configchecktest

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Case is one Config to validate: make it with [Valid] or [Invalid].
type Case[C any] struct {
	name  string
	cfg   C
	valid bool
	want  []string
}

// Valid is a case of a Config that must pass.
func Valid[C any](name string, cfg C) Case[C] { return Case[C]{name: name, cfg: cfg, valid: true} }

// Invalid is a case of a Config that must fail with an error holding
// every one of want ("Field: must be positive"); with no want, any error
// with the Config's prefix.
func Invalid[C any](name string, cfg C, want ...string) Case[C] {
	return Case[C]{name: name, cfg: cfg, want: want}
}

// Run runs each case as a parallel subtest. check applies the Config's
// defaults and validates it. A Valid case must pass, and valid,
// when not nil, checks the defaults it was given; any other must fail
// with an error that begins with prefix (the Config's, "redis subscriber
// config") and holds every Want.
func Run[C any](t *testing.T, prefix string, cases []Case[C], check func(*C) error, valid func(t *testing.T, cfg C)) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := tt.cfg
			err := check(&cfg)
			if tt.valid {
				require.NoError(t, err)
				if valid != nil {
					valid(t, cfg)
				}
				return
			}
			require.ErrorContains(t, err, prefix+": ")
			for _, w := range tt.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}
