package migrations

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strconv"
	"strings"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"

	"github.com/outflow-dev/outflow/internal/advisory"
)

// The lock is keyed by the schema's name: goose's own Postgres locker uses
// one id for the whole cluster and polls every 5 s, while a blocking
// pg_advisory_lock wakes as soon as the holder finishes and lets separate
// schemas migrate in parallel. It is the key the single-set releases used
// (hashtext of current_schema()), so an instance of such a release starting
// during an upgrade waits for it too.
func lockSchema(ctx context.Context, conn *sql.Conn, schema string) error {
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, advisory.Migrations, schema); err != nil {
		return fmt.Errorf("take migration lock of schema %s: %w", schema, err)
	}
	return nil
}

func unlockSchema(ctx context.Context, conn *sql.Conn, schema string) error {
	if _, err := conn.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, hashtext($2))`, advisory.Migrations, schema); err != nil {
		discard(conn) // a session still holding the lock must not go back to the pool
		return fmt.Errorf("release migration lock of schema %s: %w", schema, err)
	}
	return nil
}

// discard makes database/sql close conn instead of reusing it.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
}

// schemaOf is the schema a Migrator works in: the configured one, or the
// connection's current schema.
func schemaOf(ctx context.Context, conn *sql.Conn, configured string) (string, error) {
	if configured != "" {
		return configured, nil
	}
	var cur sql.NullString
	if err := conn.QueryRowContext(ctx, `SELECT current_schema()`).Scan(&cur); err != nil {
		return "", fmt.Errorf("read current schema: %w", err)
	}
	if !cur.Valid {
		return "", ErrNoSchema
	}
	return cur.String, nil
}

// prepare runs before every goose operation, under the schema's lock: it
// creates the schema when configured and missing, and the set's version
// table when missing, adopting the rows of the set's versions from
// Set.AdoptFrom. goose would create the version table itself, but outside
// any lock (its HasPending check, run by Up, takes none): doing it here
// means no process ever sees the table before the adopted versions are in
// it.
func (m *Migrator) prepare(ctx context.Context, versions []int64) (retErr error) {
	conn, err := m.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrations: connect: %w", err)
	}
	defer conn.Close()
	schema, err := schemaOf(ctx, conn, m.cfg.Schema)
	if err != nil {
		return err
	}
	if err := lockSchema(ctx, conn, schema); err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, unlockSchema(ctx, conn, schema)) }()

	if m.cfg.Schema != "" {
		var exists bool
		// Checked first: CREATE SCHEMA IF NOT EXISTS needs the CREATE
		// privilege on the database even when the schema exists.
		if err := conn.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&exists); err != nil {
			return fmt.Errorf("look for schema %s: %w", schema, err)
		}
		if !exists {
			if _, err := conn.ExecContext(ctx, `CREATE SCHEMA `+quoteIdent(schema)); err != nil {
				return fmt.Errorf("create schema %s: %w", schema, err)
			}
		}
	}

	own := quoteIdent(schema) + "." + quoteIdent(m.set.VersionTable)
	legacy := quoteIdent(schema) + "." + quoteIdent(m.set.AdoptFrom)
	var haveOwn, haveLegacy bool
	if err := conn.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL, $2 <> '' AND to_regclass($3) IS NOT NULL`,
		own, m.set.AdoptFrom, legacy).Scan(&haveOwn, &haveLegacy); err != nil {
		return fmt.Errorf("look for version tables: %w", err)
	}
	if haveOwn {
		// Another table of the same name (one of the schema's own, a
		// typo in a configured name) must not be read as versions.
		var cols int
		if err := conn.QueryRowContext(ctx, `SELECT count(*) FROM pg_attribute
			WHERE attrelid = to_regclass($1) AND NOT attisdropped AND attnum > 0
			  AND attname IN ('id', 'version_id', 'is_applied', 'tstamp')`, own).Scan(&cols); err != nil {
			return fmt.Errorf("look for version table %s: %w", own, err)
		}
		if cols != 4 {
			return fmt.Errorf("%w: %s (no id, version_id, is_applied and tstamp columns)", ErrNotVersionTable, own)
		}
		return nil
	}
	// goose's own statements, so that the table is the one goose creates.
	store, err := database.NewStore(database.DialectPostgres, own)
	if err != nil {
		return err
	}
	// One transaction: a crash leaves either no table (all of this runs
	// again) or the complete one.
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create version table: %w", err)
	}
	defer func() {
		if retErr != nil {
			_ = tx.Rollback()
		}
	}()
	if err := store.CreateVersionTable(ctx, tx); err != nil {
		return fmt.Errorf("create version table %s: %w", own, err)
	}
	if err := store.Insert(ctx, tx, database.InsertRequest{Version: 0}); err != nil {
		return fmt.Errorf("insert zero version: %w", err)
	}
	var adopted int64
	if haveLegacy && len(versions) > 0 {
		list := make([]string, len(versions))
		for i, v := range versions {
			list[i] = strconv.FormatInt(v, 10)
		}
		// Literal versions: the statement works with any driver's arguments.
		res, err := tx.ExecContext(ctx, `INSERT INTO `+own+` (version_id, is_applied, tstamp)
			SELECT version_id, is_applied, tstamp FROM `+legacy+`
			WHERE version_id IN (`+strings.Join(list, ",")+`) ORDER BY id`)
		if err != nil {
			return fmt.Errorf("copy versions from %s: %w", legacy, err)
		}
		adopted, _ = res.RowsAffected()
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("create version table: %w", err)
	}
	if adopted > 0 && m.cfg.Logger != nil {
		m.cfg.Logger.InfoContext(ctx, "migrations: adopted versions applied by an earlier release",
			slog.String("set", m.set.Name), slog.String("schema", schema),
			slog.String("from", m.set.AdoptFrom), slog.Int64("versions", adopted))
	}
	return nil
}

// session is goose's locker. goose runs every SQL migration on the
// connection it hands to the locker, so besides taking the lock it puts the
// configured schema, alone, on that connection's search_path, and restores
// the connection's own afterwards.
type session struct {
	schema string // configured; empty: current_schema()

	name    string // the schema locked
	oldPath string // the search_path to restore
	pathSet bool
	locked  bool
}

var _ lock.SessionLocker = (*session)(nil)

func (s *session) SessionLock(ctx context.Context, conn *sql.Conn) error {
	name, err := schemaOf(ctx, conn, s.schema)
	if err != nil {
		return err
	}
	if err := lockSchema(ctx, conn, name); err != nil {
		return err
	}
	s.name, s.locked = name, true
	if s.schema == "" {
		return nil
	}
	if err := conn.QueryRowContext(ctx, `SELECT current_setting('search_path')`).Scan(&s.oldPath); err != nil {
		// goose releases nothing when SessionLock fails.
		return errors.Join(fmt.Errorf("read search_path: %w", err), s.SessionUnlock(ctx, conn))
	}
	// Only the schema: an unqualified name in a migration must never
	// resolve to a table of another schema (a Down's DROP TABLE above all).
	if _, err := conn.ExecContext(ctx, `SELECT set_config('search_path', $1, false)`, quoteIdent(s.schema)); err != nil {
		return errors.Join(fmt.Errorf("set search_path to %s: %w", s.schema, err), s.SessionUnlock(ctx, conn))
	}
	s.pathSet = true
	return nil
}

func (s *session) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	ctx = context.WithoutCancel(ctx)
	var errs []error
	if s.pathSet {
		if _, err := conn.ExecContext(ctx, `SELECT set_config('search_path', $1, false)`, s.oldPath); err != nil {
			discard(conn) // a session with our search_path must not go back to the pool
			errs = append(errs, fmt.Errorf("restore search_path: %w", err))
		}
		s.pathSet = false
	}
	if s.locked {
		errs = append(errs, unlockSchema(ctx, conn, s.name))
		s.locked = false
	}
	return errors.Join(errs...)
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func isNoNextVersion(err error) bool {
	var partial *goose.PartialError
	return errors.Is(err, goose.ErrNoNextVersion) || (errors.As(err, &partial) && errors.Is(partial.Err, goose.ErrNoNextVersion))
}

func baseName(p string) string { return path.Base(p) }
