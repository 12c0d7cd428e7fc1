package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/internal/poll"
)

// Run retries parked messages until ctx is done: a failed message when its
// backoff has passed, and the held events of its aggregate, in version
// order, once it applied. Run it next to the router, one per consumer per
// process; several processes share the work (rows are claimed with SKIP
// LOCKED).
func (c *Consumer) Run(ctx context.Context) error {
	poll.Drain(ctx, c.cfg.RetryPollInterval, c.retryDue, func(err error) {
		c.cfg.Logger.Warn("retry parked messages", "consumer", c.cfg.Consumer, "error", err.Error())
	})
	return nil
}

// dueSQL picks, per aggregate, its lowest open row when it may run: a
// retrying row whose time has come, or a held row with nothing earlier open
// whose time has come or whose predecessor has just been applied (a gap that
// closed need not wait for its next try).
const dueSQL = `
SELECT d.id, d.message_id::text, d.payload, d.metadata::text, d.status, d.attempts, d.created_at
FROM dead_letters d
WHERE d.consumer = $1 AND d.status IN ('retrying', 'held')
  AND (d.next_attempt_at IS NULL OR d.next_attempt_at <= now()
       OR (d.status = 'held' AND EXISTS (
           SELECT 1 FROM consumer_aggregate_versions c
           WHERE c.consumer = d.consumer AND c.aggregate_type = d.aggregate_type AND c.aggregate_id = d.aggregate_id
             AND c.version = d.aggregate_version - 1)))
  AND NOT EXISTS (
      SELECT 1 FROM dead_letters e
      WHERE e.consumer = d.consumer AND e.aggregate_type = d.aggregate_type AND e.aggregate_id = d.aggregate_id
        AND e.status IN ('retrying', 'dead', 'held') AND e.aggregate_version < d.aggregate_version)
ORDER BY d.id
LIMIT 1
FOR UPDATE SKIP LOCKED`

// retryDue runs one due row. It returns how many rows it settled (0 or 1).
func (c *Consumer) retryDue(ctx context.Context) (int, error) {
	c.mu.Lock()
	h := c.handler
	c.mu.Unlock()
	if h == nil {
		return 0, errors.New("idempotency: Run needs the Middleware applied to a handler first")
	}
	n := 0
	err := pgx.BeginFunc(ctx, c.cfg.Pool, func(lock pgx.Tx) error {
		var (
			id        int64
			msgID, md string
			payload   []byte
			status    string
			attempts  int
			created   time.Time
		)
		err := lock.QueryRow(ctx, dueSQL, c.cfg.Consumer).Scan(&id, &msgID, &payload, &md, &status, &attempts, &created)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		msg := message.NewMessage(msgID, payload)
		if err := json.Unmarshal([]byte(md), &msg.Metadata); err != nil {
			return fmt.Errorf("metadata of dead letter %d: %w", id, err)
		}
		msg.SetContext(ctx)
		env, err := events.EnvelopeFromMessage(msg)
		if err != nil {
			return fmt.Errorf("envelope of dead letter %d: %w", id, err)
		}
		// The row stays locked (in lock) while the handler runs in its own
		// transaction, so no other process runs it at the same time. Only
		// open rows of lower versions block it.
		_, o, herr := c.apply(ctx, h, msg, env, false)
		n = 1
		switch {
		case herr == nil && (o == applied || o == stale || o == duplicate):
			_, err = lock.Exec(ctx, `UPDATE dead_letters SET status = 'resolved', resolved_at = now() WHERE id = $1`, id)
			c.cfg.Logger.Info("parked message applied", "consumer", c.cfg.Consumer, "message_id", msgID,
				"aggregate_id", env.AggregateID, "aggregate_version", env.AggregateVersion, "outcome", o.String())
		case herr == nil && time.Since(created) >= c.cfg.GapTimeout: // the gap never filled: report it
			n = 0
			_, err = lock.Exec(ctx, `UPDATE dead_letters SET status = 'dead', error = $2, next_attempt_at = NULL WHERE id = $1`,
				id, fmt.Sprintf("version %d waited %s for version %d", env.AggregateVersion, c.cfg.GapTimeout, env.AggregateVersion-1))
			c.cfg.Logger.Error("gap timed out: message dead", "consumer", c.cfg.Consumer, "message_id", msgID,
				"aggregate_id", env.AggregateID, "aggregate_version", env.AggregateVersion)
		case herr == nil: // a gap: wait for the earlier event
			n = 0
			_, err = lock.Exec(ctx, `UPDATE dead_letters SET next_attempt_at = $2 WHERE id = $1`,
				id, time.Now().Add(c.cfg.GapRetryDelay))
		default:
			attempts++
			if attempts >= c.cfg.MaxAttempts {
				_, err = lock.Exec(ctx, `UPDATE dead_letters SET status = 'dead', attempts = $2, error = $3, next_attempt_at = NULL WHERE id = $1`,
					id, attempts, herr.Error())
				c.cfg.Logger.Error("message dead-lettered after max attempts", "consumer", c.cfg.Consumer, "message_id", msgID,
					"aggregate_id", env.AggregateID, "attempts", attempts, "error", herr.Error())
			} else {
				_, err = lock.Exec(ctx, `UPDATE dead_letters SET status = 'retrying', attempts = $2, error = $3, next_attempt_at = $4 WHERE id = $1`,
					id, attempts, herr.Error(), time.Now().Add(c.backoff(attempts)))
			}
		}
		return err
	})
	return n, err
}
