package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// lockClass namespaces our advisory locks ("outf" in ASCII).
const lockClass = 0x6f757466

// schemaLocker serializes migrations per schema. goose's own Postgres locker
// uses one lock id for the whole cluster and polls every 5 s; a blocking
// pg_advisory_lock keyed by the schema wakes as soon as the holder finishes
// and lets separate schemas migrate in parallel.
type schemaLocker struct{}

var _ lock.SessionLocker = schemaLocker{}

func (schemaLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	_, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1, hashtext(current_schema()))`, lockClass)
	if err != nil {
		return fmt.Errorf("take migration lock: %w", err)
	}
	return nil
}

func (schemaLocker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	_, err := conn.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, hashtext(current_schema()))`, lockClass)
	if err != nil {
		return fmt.Errorf("release migration lock: %w", err)
	}
	return nil
}

func isNoNextVersion(err error) bool {
	var partial *goose.PartialError
	return errors.Is(err, goose.ErrNoNextVersion) || (errors.As(err, &partial) && errors.Is(partial.Err, goose.ErrNoNextVersion))
}

func baseName(p string) string { return path.Base(p) }
