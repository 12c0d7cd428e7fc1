package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// ErrInvalidSets is returned by [UpSets] and [UpSetsPool] for a list of
// sets they cannot apply: none, two sharing a name or a version table, or
// one whose version table is another's AdoptFrom (the earlier release's
// table, whose versions it would read as its own).
var ErrInvalidSets = errors.New("migrations: invalid sets")

// Applied is one migration that [UpSets] ran, with the set it belongs to.
type Applied struct {
	Set string
	Result
}

// UpSets applies every pending migration of each set, in the order given
// (a service's sets after the framework's, on whose tables they may
// build), in the schema cfg names. Each set runs as a [Migrator] does,
// under the schema's advisory lock, so processes running UpSets together
// apply each migration once. It stops at the first set that fails and
// returns what ran before it along with the error.
func UpSets(ctx context.Context, db *sql.DB, cfg Config, sets ...Set) ([]Applied, error) {
	if db == nil {
		return nil, errors.New("migrations: db is required")
	}
	if err := checkSets(sets); err != nil {
		return nil, err
	}
	var out []Applied
	for _, set := range sets {
		m, err := NewMigrator(db, set, cfg)
		if err != nil {
			return out, err
		}
		rs, err := m.Up(ctx)
		for _, r := range rs {
			out = append(out, Applied{Set: set.Name, Result: r})
		}
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// UpSetsPool is [UpSets] over a pgx pool, for a service whose code holds
// a *pgxpool.Pool and no *sql.DB. It borrows the pool's connections and
// leaves the pool open.
func UpSetsPool(ctx context.Context, pool *pgxpool.Pool, cfg Config, sets ...Set) ([]Applied, error) {
	if pool == nil {
		return nil, errors.New("migrations: pool is required")
	}
	// Closing this *sql.DB releases its connections to the pool and
	// leaves the pool itself open: the connector has no Close.
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return UpSets(ctx, db, cfg, sets...)
}

// checkSets refuses what would make two sets share a version table (each
// would take the other's versions for its own), a set use as its version
// table one that another adopts from (the same, with the earlier
// release's versions), or two sets share a name (the results could not
// tell them apart).
func checkSets(sets []Set) error {
	if len(sets) == 0 {
		return fmt.Errorf("%w: no set given", ErrInvalidSets)
	}
	names := map[string]bool{}
	tables := map[string]string{}
	for _, s := range sets {
		if err := s.validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidSets, err)
		}
		if names[s.Name] {
			return fmt.Errorf("%w: set %s given twice", ErrInvalidSets, s.Name)
		}
		names[s.Name] = true
		if other, ok := tables[s.VersionTable]; ok {
			return fmt.Errorf("%w: sets %s and %s share the version table %s", ErrInvalidSets, other, s.Name, s.VersionTable)
		}
		tables[s.VersionTable] = s.Name
	}
	for _, s := range sets {
		for _, o := range sets {
			if o.AdoptFrom != "" && o.AdoptFrom == s.VersionTable {
				return fmt.Errorf("%w: set %s's version table %s is the one set %s adopts its versions from", ErrInvalidSets, s.Name, s.VersionTable, o.Name)
			}
		}
	}
	return nil
}
