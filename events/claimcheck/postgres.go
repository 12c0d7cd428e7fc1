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
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// partitionPrefix names the day partitions of outflow_claim_bodies:
// outflow_claim_bodies_20261205 holds the bodies created that day (UTC).
const partitionPrefix = Table + "_"

// dropMargin is how long after its day ends a partition may be dropped at
// the earliest: created_at is its transaction's start, so a transaction
// begun before midnight may still write into the day before; none lives
// a day.
const dropMargin = 24 * time.Hour

// EnsurePartitions creates the partitions of outflow_claim_bodies for the
// day of now (UTC) and the next, when missing, so that bodies land in a
// partition retention drops whole. Each waits at most a second for its
// lock (creating a partition locks the table against writers for a
// moment): one that cannot is created at the next run. Without migration
// 00033 it does nothing.
func EnsurePartitions(ctx context.Context, db Beginner, now time.Time) error {
	for _, d := range []time.Time{now.UTC(), now.UTC().Add(24 * time.Hour)} {
		day := time.Date(d.Year(), d.Month(), d.Day(), 0, 0, 0, 0, time.UTC)
		name := partitionPrefix + day.Format("20060102")
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			var exists, parent bool
			if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass('outflow_claim_bodies') IS NOT NULL`, name).
				Scan(&exists, &parent); err != nil || exists || !parent {
				return err
			}
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '1s'`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s PARTITION OF outflow_claim_bodies FOR VALUES FROM ('%s') TO ('%s')`,
				pgx.Identifier{name}.Sanitize(), day.Format(time.RFC3339), day.Add(24*time.Hour).Format(time.RFC3339)))
			return err
		})
		if err != nil {
			return fmt.Errorf("claimcheck: create partition %s: %w", name, err)
		}
	}
	return nil
}

// liveEventSQL finds, in a partition of the bodies (%s), one whose event
// is still kept: in the outbox (its partition not dropped yet, or its row
// of outbox_default not deleted), or parked by the WAL relay.
const liveEventSQL = `SELECT EXISTS (SELECT 1 FROM %s b WHERE EXISTS (SELECT 1 FROM outbox o WHERE o.message_id = b.message_id)
	OR EXISTS (SELECT 1 FROM outbox_wal_parked w WHERE w.message_id = b.message_id))`

// PurgeBodies removes the bodies of the events gone, created before
// cutoff, and returns how many days' partitions it dropped and how many
// rows of the default partition it deleted. It creates the partitions of
// today and tomorrow first (EnsurePartitions).
//
// A day's partition goes whole (DROP TABLE: nothing deleted, nothing for
// vacuum, no WAL but the catalog's) once the day ended before cutoff, and
// a day ago at least, and no body in it belongs to an event still kept:
// in the outbox (the forwarder's purge drops a partition of the outbox
// once its newest row is past the retention, so an event can outlive the
// cutoff by a partition's span) or parked by the WAL relay. So a body
// never goes before its event, and goes at the first run after its whole
// day's events did; a day kept by one event (a parked one) keeps only
// itself. The check and the drop hold the partition's lock,
// waited for a fifth of a second at most (a long transaction postpones
// the drop to the next run). Bodies in outflow_claim_bodies_default are
// deleted batch rows a transaction, on the same rule. Without migration
// 00033 it does nothing.
func PurgeBodies(ctx context.Context, pool Beginner, cutoff time.Time, batch int) (dropped int, deleted int64, err error) {
	if batch < 1 {
		return 0, 0, fmt.Errorf("claimcheck: purge bodies: batch %d: must be at least 1", batch)
	}
	if err := EnsurePartitions(ctx, pool, time.Now()); err != nil {
		return 0, 0, err
	}
	var names []string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
			WHERE i.inhparent = to_regclass('outflow_claim_bodies') ORDER BY 1`)
		if err != nil {
			return err
		}
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("claimcheck: purge bodies: %w", err)
	}
	latest := time.Now().Add(-dropMargin)
	for _, n := range names {
		day, perr := time.Parse("20060102", strings.TrimPrefix(n, partitionPrefix))
		if perr != nil || !strings.HasPrefix(n, partitionPrefix) {
			continue // the default partition
		}
		end := day.Add(24 * time.Hour)
		if end.After(cutoff) || end.After(latest) {
			break // the names sort by day: nor are the later ones past
		}
		table := pgx.Identifier{n}.Sanitize()
		var drop bool
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '200ms'`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `LOCK TABLE `+table+` IN ACCESS EXCLUSIVE MODE`); err != nil {
				return err
			}
			var live bool
			if err := tx.QueryRow(ctx, fmt.Sprintf(liveEventSQL, table)).Scan(&live); err != nil || live {
				return err
			}
			drop = true
			_, err := tx.Exec(ctx, `DROP TABLE `+table)
			return err
		})
		if err != nil {
			return dropped, 0, fmt.Errorf("claimcheck: purge bodies: drop %s: %w", n, err)
		}
		if !drop {
			continue // an event of that day is kept (parked, say): look past it
		}
		dropped++
	}
	deleted, err = purgeDefault(ctx, pool, cutoff, batch)
	return dropped, deleted, err
}

// purgeDefault deletes the bodies of outflow_claim_bodies_default created
// before cutoff whose event is gone, batch rows a transaction.
func purgeDefault(ctx context.Context, pool Beginner, cutoff time.Time, batch int) (int64, error) {
	var total int64
	for {
		var n int64
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT to_regclass('outflow_claim_bodies_default') IS NOT NULL`).Scan(&exists); err != nil || !exists {
				return err
			}
			tag, err := tx.Exec(ctx, `
				DELETE FROM outflow_claim_bodies_default WHERE ctid = ANY (ARRAY(
					SELECT b.ctid FROM outflow_claim_bodies_default b
					WHERE b.created_at < $1
					  AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.message_id = b.message_id)
					  AND NOT EXISTS (SELECT 1 FROM outbox_wal_parked w WHERE w.message_id = b.message_id)
					LIMIT $2))`, cutoff, batch)
			n = tag.RowsAffected()
			return err
		})
		if err != nil {
			return total, fmt.Errorf("claimcheck: purge bodies: default partition: %w", err)
		}
		total += n
		if n < int64(batch) {
			return total, nil
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
