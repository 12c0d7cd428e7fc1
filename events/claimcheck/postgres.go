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

// PurgeBodies deletes the bodies created before cutoff whose event is
// gone: no longer in the outbox (its partition dropped, or its row of
// outbox_default deleted, by the forwarder's purge) nor parked by the WAL
// relay (outbox_wal_parked). So a body goes with its event, at the same
// cutoff, and never before it: a parked event keeps its body. It walks
// the table in id order (insertion order), batch rows a transaction, and
// stops at the first row newer than cutoff; it returns how many went.
// Each body is a delete (WAL of the heap and its TOAST chunks, and
// vacuum): bodies are few, being large, and this keeps them out of the
// outbox's partitions, which go whole. Without migration 00033 it does
// nothing.
func PurgeBodies(ctx context.Context, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, cutoff time.Time, batch int) (int64, error) {
	if batch < 1 {
		return 0, fmt.Errorf("claimcheck: purge bodies: batch %d: must be at least 1", batch)
	}
	var (
		total int64
		after int64 = -1
	)
	for {
		var (
			lastID  *int64
			deleted int64
			reached *bool
			exists  bool
		)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, `SELECT to_regclass('outflow_claim_bodies') IS NOT NULL`).Scan(&exists); err != nil || !exists {
				return err
			}
			// outbox_wal_parked exists from migration 00027 on, before
			// 00033: both are there.
			return tx.QueryRow(ctx, `
				WITH scan AS (
					SELECT id, message_id, created_at FROM outflow_claim_bodies WHERE id > $1 ORDER BY id LIMIT $2
				), del AS (
					DELETE FROM outflow_claim_bodies b USING scan s
					WHERE b.id = s.id AND s.created_at < $3
					  AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.message_id = s.message_id)
					  AND NOT EXISTS (SELECT 1 FROM outbox_wal_parked w WHERE w.message_id = s.message_id)
					RETURNING b.id
				)
				SELECT (SELECT max(id) FROM scan), (SELECT count(*) FROM del), (SELECT bool_or(created_at >= $3) FROM scan)`,
				after, batch, cutoff).Scan(&lastID, &deleted, &reached)
		})
		if err != nil {
			return total, fmt.Errorf("claimcheck: purge bodies: %w", err)
		}
		total += deleted
		if !exists || lastID == nil || (reached != nil && *reached) {
			return total, nil
		}
		after = *lastID
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
