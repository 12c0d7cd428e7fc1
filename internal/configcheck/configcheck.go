// Package configcheck collects what is wrong with a Config, so that its
// constructor reports every wrong field at once, each named, rather than
// the first: the one validation style of Outflow's Configs (defaults
// first, then validate).
package configcheck

import (
	"errors"
	"fmt"
)

// Errors are a Config's field errors. The zero value is ready to use.
type Errors []error

// Check records "field: want" unless ok.
func (e *Errors) Check(ok bool, field, want string) {
	if !ok {
		*e = append(*e, fmt.Errorf("%s: %s", field, want))
	}
}

// Err returns nil when nothing was recorded, else every error joined,
// prefixed with what was validated ("forwarder config").
func (e Errors) Err(prefix string) error {
	if err := errors.Join(e...); err != nil {
		return fmt.Errorf("%s: %w", prefix, err)
	}
	return nil
}
