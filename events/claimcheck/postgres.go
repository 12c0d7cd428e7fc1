package claimcheck

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outflow-dev/outflow/internal/advisory"
)

// Table is the PostgreSQL store's table, created by framework migration
// 00033.
const Table = "outflow_claim_bodies"

// ReaderRole is the role whose members may read the bodies (granted
// SELECT by migration 00033).
const ReaderRole = "outflow_claim_reader"

// Querier reads the bodies: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Postgres is the default [Store]: bodies in table outflow_claim_bodies
// of the producer's database, written in the business transaction.
type Postgres struct {
	// DB is where Get reads, connected as a role that may read the
	// bodies (a member of outflow_claim_reader, or the table's owner).
	// Put does not use it: it writes in the caller's transaction. Nil:
	// Get fails.
	DB Querier
}

var _ Store = Postgres{}

// Put inserts bodies in one statement in tx.
func (p Postgres) Put(ctx context.Context, tx Execer, bodies []Body) error {
	if len(bodies) == 0 {
		return nil
	}
	var b strings.Builder
	b.WriteString(`INSERT INTO outflow_claim_bodies (message_id, sha256, size, body) VALUES `)
	args := make([]any, 0, 4*len(bodies))
	for i, body := range bodies {
		if i > 0 {
			b.WriteString(", ")
		}
		n := 4 * i
		fmt.Fprintf(&b, "($%d::uuid, $%d, $%d, $%d)", n+1, n+2, n+3, n+4)
		args = append(args, body.MessageID, body.Ref.SHA256[:], body.Ref.Size, body.Data)
	}
	if err := tx.Exec(ctx, b.String(), args...); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			// The producer's side: outflow_claim_reader gives SELECT only.
			return fmt.Errorf("claimcheck: store %d bodies: %w: grant INSERT ON %s to the writer's role (or write as the table's owner): %w",
				len(bodies), ErrStoreForbidden, Table, err)
		}
		return fmt.Errorf("claimcheck: store %d bodies: %w", len(bodies), classify(err))
	}
	return nil
}

// Get reads the body of ref, whose ID is its event's message id.
func (p Postgres) Get(ctx context.Context, ref Ref) ([]byte, error) {
	if p.DB == nil {
		return nil, fmt.Errorf("claimcheck: body %s: Postgres.DB is nil", ref.ID)
	}
	var body []byte
	err := p.DB.QueryRow(ctx, `SELECT body FROM outflow_claim_bodies WHERE message_id = $1::uuid`, ref.ID).Scan(&body)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, fmt.Errorf("%w: body %s: not in %s (purged with its event, or never committed)", ErrBodyGone, ref.ID, Table)
	case err != nil:
		return nil, fmt.Errorf("claimcheck: fetch body %s: %w", ref.ID, classify(err))
	}
	return body, nil
}

// classify wraps the sentinel a PostgreSQL error stands for.
func classify(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42501": // insufficient_privilege
			return fmt.Errorf("%w (grant %s to this role): %w", ErrBodyForbidden, ReaderRole, err)
		case "42P01": // undefined_table
			return fmt.Errorf("%w: %w", ErrNotMigrated, err)
		case "22P02": // invalid_text_representation: the id is not a uuid
			return fmt.Errorf("%w: %w", ErrBodyTampered, err)
		}
	}
	return err
}

// Beginner opens a transaction: a *pgxpool.Pool or a *pgx.Conn.
type Beginner = advisory.Beginner

// partitionPrefix names the day partitions of outflow_claim_bodies:
// outflow_claim_bodies_20261205 holds the bodies created that day (UTC).
const partitionPrefix = Table + "_"

// DefaultPartition is where a body lands whose day has no partition.
const DefaultPartition = Table + "_default"

// dropMargin is how long after its day ends a partition may be dropped at
// the earliest: created_at is its transaction's start, so a transaction
// begun before midnight may still write into the day before; none lives
// a day. Migration 00033's functions enforce it too.
const dropMargin = 24 * time.Hour

// DaysAhead is how many days past today EnsurePartitions keeps a
// partition for: a purge that does not run for that long (every instance
// down, or lock timeouts) still leaves bodies in day partitions.
const DaysAhead = 3

// Lock timeouts: creating a partition (ATTACH) locks the default
// partition exclusively, dropping one the whole table; both wait this long
// at most, then leave the partition to the next run rather than queue
// producers and consumers behind a long transaction.
const (
	createLockTimeout = "1s"
	dropLockTimeout   = "200ms"
)

// PurgeStats says what [PurgeBodies] did.
type PurgeStats struct {
	// Created are the day partitions created ahead.
	Created []string
	// Dropped is how many day partitions went whole.
	Dropped int
	// Deleted is how many rows of the default partition went.
	Deleted int64
	// Skipped are the partitions (DefaultPartition for its delete) left
	// to the next run because their lock was not granted in time (a long
	// transaction reading or writing bodies).
	Skipped []string
	// Busy: another caller held the purge's advisory lock (or migration
	// 00033 is not applied); this one stopped there.
	Busy bool
}

// isLockTimeout: PostgreSQL's lock_not_available (lock_timeout expired).
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// lockedTx runs fn in a transaction holding the purge's advisory lock
// (try-lock, released at its end), with lock_timeout set; ok is false when
// another caller holds the lock, or when migration 00033 (its functions)
// is not there.
func lockedTx(ctx context.Context, db Beginner, lockTimeout string, fn func(tx pgx.Tx) error) (ok bool, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, advisory.TrySQL+` AND to_regprocedure('outflow_claim_bodies_add_day(date)') IS NOT NULL`,
			advisory.BodiesPurge).Scan(&ok); err != nil || !ok {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, lockTimeout); err != nil {
			return err
		}
		return fn(tx)
	})
	return ok, err
}

// EnsurePartitions creates the partitions of outflow_claim_bodies for the
// day of now (UTC) and the DaysAhead next, when missing, so that bodies
// land in a partition retention drops whole. A day the default partition
// already holds bodies of is skipped (its partition could not be
// attached; those bodies are purged from the default partition). A day
// whose lock is not granted within a second is left to the next run; any
// other failure does not stop the next days: their errors are joined.
// Without migration 00033 it does nothing.
func EnsurePartitions(ctx context.Context, db Beginner, now time.Time) error {
	var st PurgeStats
	return ensurePartitions(ctx, db, now, &st)
}

func ensurePartitions(ctx context.Context, db Beginner, now time.Time, st *PurgeStats) error {
	var errs []error
	for i := range DaysAhead + 1 {
		d := now.UTC().AddDate(0, 0, i)
		day := time.Date(d.Year(), d.Month(), d.Day(), 0, 0, 0, 0, time.UTC)
		var name *string
		ok, err := lockedTx(ctx, db, createLockTimeout, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `SELECT outflow_claim_bodies_add_day($1::date)`, day.Format(time.DateOnly)).Scan(&name)
		})
		switch {
		case isLockTimeout(err):
			st.Skipped = append(st.Skipped, partitionPrefix+day.Format("20060102"))
		case err != nil:
			errs = append(errs, fmt.Errorf("claimcheck: create partition %s: %w", partitionPrefix+day.Format("20060102"), err))
		case !ok:
			st.Busy = true
			return errors.Join(errs...)
		case name != nil:
			st.Created = append(st.Created, *name)
		}
	}
	return errors.Join(errs...)
}

// PurgeBodies removes the bodies of the events gone, created before
// cutoff. It creates the partitions of today and the DaysAhead next first
// (EnsurePartitions); a failure there does not keep it from purging.
//
// A day's partition goes whole (DROP TABLE: nothing deleted, nothing for
// vacuum, no WAL but the catalog's) once the day ended before cutoff, and
// a day ago at least, and no body in it belongs to an event still kept:
// in the outbox (the forwarder's purge drops a partition of the outbox
// once its newest row is past the retention, so an event can outlive the
// cutoff by a partition's span) or parked by the WAL relay. So a body
// never goes before its event, and goes at the first run after its whole
// day's events did; a day kept by one event (a parked one) keeps only
// itself. The check runs before the drop takes the table's exclusive lock
// (nothing writes into a day that old), which it waits for a fifth of a
// second at most: a transaction reading bodies for longer leaves that day
// to the next run (PurgeStats.Skipped), as it does the default
// partition's delete. Bodies in outflow_claim_bodies_default are deleted
// batch rows a transaction, on the same rule.
//
// The work runs in migration 00033's SECURITY DEFINER functions: the
// caller's role needs EXECUTE on them, neither the table's ownership nor
// SELECT on the bodies. One caller at a time per schema does it (an
// advisory try-lock): the others return with PurgeStats.Busy. Errors of
// several days are joined; each is tried. Without migration 00033 it
// does nothing.
func PurgeBodies(ctx context.Context, pool Beginner, cutoff time.Time, batch int) (PurgeStats, error) {
	return purgeBodies(ctx, pool, time.Now(), cutoff, batch)
}

// purgeBodies is PurgeBodies at now (tests move days forward).
func purgeBodies(ctx context.Context, pool Beginner, now, cutoff time.Time, batch int) (PurgeStats, error) {
	var st PurgeStats
	if batch < 1 {
		return st, fmt.Errorf("claimcheck: purge bodies: batch %d: must be at least 1", batch)
	}
	var errs []error
	if err := ensurePartitions(ctx, pool, now, &st); err != nil {
		errs = append(errs, err)
	}
	if st.Busy {
		return st, errors.Join(errs...)
	}
	var names []string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
			WHERE i.inhparent = to_regclass('outflow_claim_bodies') ORDER BY 1`)
		if err != nil {
			return err
		}
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return st, errors.Join(append(errs, fmt.Errorf("claimcheck: purge bodies: list partitions: %w", err))...)
	}
	latest := now.Add(-dropMargin)
	for _, n := range names {
		day, perr := time.Parse("20060102", strings.TrimPrefix(n, partitionPrefix))
		if perr != nil || !strings.HasPrefix(n, partitionPrefix) {
			continue // the default partition
		}
		end := day.Add(24 * time.Hour)
		if end.After(cutoff) || end.After(latest) {
			break // the names sort by day: nor are the later ones past
		}
		var dropped bool
		ok, err := lockedTx(ctx, pool, dropLockTimeout, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `SELECT outflow_claim_bodies_drop_day($1::date)`, day.Format(time.DateOnly)).Scan(&dropped)
		})
		switch {
		case isLockTimeout(err):
			st.Skipped = append(st.Skipped, n)
		case err != nil:
			errs = append(errs, fmt.Errorf("claimcheck: purge bodies: drop %s: %w", n, err))
		case !ok:
			st.Busy = true
			return st, errors.Join(errs...)
		case dropped:
			st.Dropped++
		}
		// Not dropped: an event of that day is kept (parked, say): look
		// past it.
	}
	if err := purgeDefault(ctx, pool, cutoff, batch, &st); err != nil {
		errs = append(errs, err)
	}
	return st, errors.Join(errs...)
}

// purgeDefault deletes the bodies of outflow_claim_bodies_default created
// before cutoff whose event is gone, batch rows a transaction.
func purgeDefault(ctx context.Context, pool Beginner, cutoff time.Time, batch int, st *PurgeStats) error {
	for {
		var n int64
		ok, err := lockedTx(ctx, pool, dropLockTimeout, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `SELECT outflow_claim_bodies_purge_default($1, $2)`, cutoff, batch).Scan(&n)
		})
		switch {
		case isLockTimeout(err):
			st.Skipped = append(st.Skipped, DefaultPartition)
			return nil
		case err != nil:
			return fmt.Errorf("claimcheck: purge bodies: default partition: %w", err)
		case !ok:
			st.Busy = true
			return nil
		}
		st.Deleted += n
		if n < int64(batch) {
			return nil
		}
	}
}

// ResolveTx is [Resolve] from the [Postgres] store read through tx, the
// consumer's transaction, when the bodies live in the consumer's own
// database: in a savepoint, so that a refusal (ErrBodyForbidden) or a
// body gone leaves tx usable for the consumer's bookkeeping, and on the
// transaction's connection, so that a handler holding one never waits for
// a second to fetch its body.
func ResolveTx(ctx context.Context, tx pgx.Tx, msg *message.Message) (*message.Message, error) {
	if _, ok, _ := RefFromMetadata(msg.Metadata); !ok {
		return msg, nil // inline: no savepoint for nothing
	}
	var out *message.Message
	err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
		var err error
		out, err = Resolve(ctx, Postgres{DB: sp}, msg)
		return err
	})
	return out, err
}
