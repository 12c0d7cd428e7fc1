package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/events"
)

// Ordering says how a consumer treats aggregate versions.
type Ordering int

const (
	// Strict applies each aggregate's versions one by one, in order.
	Strict Ordering = iota
	// LatestWins applies a version newer than the last applied one and
	// skips older ones: for projections that only need the latest state.
	LatestWins
)

// ErrGap is returned (and the message redelivered) when a message's version
// is ahead of the next one expected.
var ErrGap = errors.New("idempotency: version gap: an earlier event of the aggregate has not been applied yet")

// Config configures the middleware of one consumer.
type Config struct {
	// Pool is the consumer's database. Required.
	Pool *pgxpool.Pool
	// Consumer names the consumer: deduplication is per (message, consumer).
	// Required.
	Consumer string
	// Ordering defaults to Strict.
	Ordering Ordering
	// GapRetryDelay is how long a message that arrived ahead of its
	// predecessor waits before it is redelivered. Defaults to 1s.
	GapRetryDelay time.Duration
	// GapTimeout is how long a gap may stay open before the waiting message
	// is dead-lettered and reported. Defaults to 5m.
	GapTimeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

type txKey struct{}

// Tx returns the transaction the middleware opened for the message being
// handled. Write the handler's effects in it: they commit with the message's
// processed_messages row, or not at all.
func Tx(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// Outcome is what the middleware decided for one message.
type Outcome int

const (
	Applied Outcome = iota
	Duplicate
	Stale
	Gap
)

type middleware struct {
	cfg Config
	mu  sync.Mutex
	gap map[string]time.Time // message id -> first time it was held for a gap
}

// Middleware returns the Watermill handler middleware for one consumer.
func Middleware(cfg Config) (message.HandlerMiddleware, error) {
	if cfg.Pool == nil {
		return nil, errors.New("idempotency config: Pool is required")
	}
	if cfg.Consumer == "" {
		return nil, errors.New("idempotency config: Consumer is required")
	}
	if cfg.GapRetryDelay == 0 {
		cfg.GapRetryDelay = time.Second
	}
	if cfg.GapTimeout == 0 {
		cfg.GapTimeout = 5 * time.Minute
	}
	if cfg.GapRetryDelay < 0 || cfg.GapTimeout < cfg.GapRetryDelay {
		return nil, errors.New("idempotency config: GapRetryDelay must be positive and at most GapTimeout")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &middleware{cfg: cfg, gap: make(map[string]time.Time)}
	return m.wrap, nil
}

// claimSQL records the message and checks its version in one statement. The
// upsert locks the aggregate's row for the transaction, so two deliveries of
// one aggregate serialize, and sets the new version when the message
// applies; a rollback undoes both.
const claimSQL = `
WITH seen AS (
    INSERT INTO processed_messages (message_id, consumer) VALUES ($1, $2)
    ON CONFLICT DO NOTHING RETURNING 1
), v AS (
    INSERT INTO consumer_aggregate_versions AS c (consumer, aggregate_type, aggregate_id, version, prev_version)
    VALUES ($2, $3, $4, CASE WHEN ($6 AND $5 = 1) OR (NOT $6 AND $5 > 0) THEN $5 ELSE 0 END, 0)
    ON CONFLICT (consumer, aggregate_type, aggregate_id) DO UPDATE SET
        prev_version = c.version,
        version = CASE WHEN ($6 AND $5 = c.version + 1) OR (NOT $6 AND $5 > c.version) THEN $5 ELSE c.version END,
        updated_at = now()
    RETURNING prev_version, version
)
SELECT (SELECT count(*) FROM seen), prev_version, version FROM v`

func (m *middleware) wrap(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		env, err := events.EnvelopeFromMessage(msg)
		if err != nil {
			return nil, fmt.Errorf("idempotency: %w", err)
		}
		ctx := msg.Context()
		var (
			out     []*message.Message
			outcome Outcome
		)
		err = pgx.BeginFunc(ctx, m.cfg.Pool, func(tx pgx.Tx) error {
			var (
				fresh        int
				prev, stored int64
			)
			if err := tx.QueryRow(ctx, claimSQL, env.MessageID, m.cfg.Consumer, env.AggregateType, env.AggregateID,
				env.AggregateVersion, m.cfg.Ordering == Strict).Scan(&fresh, &prev, &stored); err != nil {
				return fmt.Errorf("idempotency: record message: %w", err)
			}
			outcome = classify(fresh == 1, prev, stored, env.AggregateVersion)
			switch outcome {
			case Duplicate:
				return errRollback
			case Stale:
				return nil // keep the processed row: a stale message is done
			case Gap:
				return errRollback
			}
			msg.SetContext(context.WithValue(ctx, txKey{}, tx))
			defer msg.SetContext(ctx)
			var err error
			out, err = h(msg)
			return err
		})
		if errors.Is(err, errRollback) {
			err = nil
		}
		if err != nil {
			return nil, err
		}
		switch outcome {
		case Duplicate, Stale:
			m.cfg.Logger.Debug("message skipped", "consumer", m.cfg.Consumer, "message_id", env.MessageID,
				"aggregate_id", env.AggregateID, "aggregate_version", env.AggregateVersion, "outcome", outcome.String())
			return nil, nil
		case Gap:
			return nil, m.holdGap(ctx, msg, env)
		}
		m.forgetGap(env.MessageID)
		return out, nil
	}
}

var errRollback = errors.New("rollback")

// classify reads the claim statement's result. stored is the aggregate's
// version after the upsert; it equals the message's version only when the
// message applies.
func classify(fresh bool, prev, stored, version int64) Outcome {
	switch {
	case !fresh:
		return Duplicate
	case stored == version && prev < version:
		return Applied
	case version <= stored:
		return Stale
	default:
		return Gap
	}
}

func (o Outcome) String() string {
	return [...]string{"applied", "duplicate", "stale", "gap"}[o]
}

// holdGap waits GapRetryDelay and returns ErrGap so the message is
// redelivered, until GapTimeout has passed since it was first held: then it
// is dead-lettered, reported and acknowledged.
func (m *middleware) holdGap(ctx context.Context, msg *message.Message, env events.Envelope) error {
	m.mu.Lock()
	first, ok := m.gap[env.MessageID]
	if !ok {
		first = time.Now()
		m.gap[env.MessageID] = first
	}
	m.mu.Unlock()
	if time.Since(first) >= m.cfg.GapTimeout {
		if err := m.deadLetter(ctx, msg, env, "gap", fmt.Sprintf("version %d waited %s for its predecessor", env.AggregateVersion, m.cfg.GapTimeout), 0); err != nil {
			return err
		}
		m.forgetGap(env.MessageID)
		m.cfg.Logger.Error("gap timed out: message dead-lettered", "consumer", m.cfg.Consumer, "message_id", env.MessageID,
			"aggregate_id", env.AggregateID, "aggregate_version", env.AggregateVersion)
		return nil
	}
	t := time.NewTimer(m.cfg.GapRetryDelay)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return fmt.Errorf("%w (aggregate %s, version %d)", ErrGap, env.AggregateID, env.AggregateVersion)
}

func (m *middleware) forgetGap(id string) {
	m.mu.Lock()
	delete(m.gap, id)
	m.mu.Unlock()
}

// deadLetter stores the whole message for an operator and marks it
// processed for this consumer, in one transaction.
func (m *middleware) deadLetter(ctx context.Context, msg *message.Message, env events.Envelope, reason, errText string, attempts int) error {
	return pgx.BeginFunc(context.WithoutCancel(ctx), m.cfg.Pool, func(tx pgx.Tx) error {
		md := map[string]string(msg.Metadata)
		if _, err := tx.Exec(ctx, `
			INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version,
			                          payload, metadata, reason, error, attempts)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (consumer, message_id) DO NOTHING`,
			m.cfg.Consumer, env.MessageID, env.EventType, env.AggregateType, env.AggregateID, env.AggregateVersion,
			[]byte(msg.Payload), md, reason, errText, attempts); err != nil {
			return fmt.Errorf("idempotency: dead-letter: %w", err)
		}
		_, err := tx.Exec(ctx, `INSERT INTO processed_messages (message_id, consumer) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
			env.MessageID, m.cfg.Consumer)
		return err
	})
}
