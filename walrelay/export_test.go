package walrelay

import (
	"context"
	"time"
)

// BodiesPurger returns one run of the bodies' purge of a relay of cfg at
// a given now, its WAL marks kept across calls as bodiesLoop keeps them.
func BodiesPurger(cfg Config) (func(ctx context.Context, now time.Time) error, error) {
	r, err := New(cfg)
	if err != nil {
		return nil, err
	}
	var marks relayMarks
	return func(ctx context.Context, now time.Time) error { return r.purgeBodies(ctx, &marks, now) }, nil
}
