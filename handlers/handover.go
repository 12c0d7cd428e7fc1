package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/internal/poll"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/fanout"
)

// HandOverBatch is how many legacy deliveries [RunHandOver] moves per
// transaction.
const HandOverBatch = 100

// HandOverOrphaned is the last_error of a legacy delivery [HandOver] did
// not move because its merchant's endpoint was deleted (through the
// endpoints API) before the handover: it is marked 'dead' with it, as the
// framework's package records nothing for an account without an endpoint
// that wants the event, and the legacy sender must not send it to the URL
// the merchant took away. Its row stays in webhook_deliveries (counted as
// dead by `outflow stats`) until retention purges it.
const HandOverOrphaned = "handover: the merchant's webhook endpoint was deleted before the delivery was handed over: not sent"

// handOverPickSQL takes up to $1 legacy deliveries that are pending and
// not in flight: never leased, released, settled for a retry (lease_token
// NULL, whenever their next attempt is due), or leased by a sender whose
// lease lapsed (next_attempt_at, the lease's end, passed: that sender's
// request is over, and its settle, if it comes, matches no moved row).
// Rows a legacy sender is leasing right now are locked: skipped, not
// waited for. Most due first, on the pending deliveries' index.
const handOverPickSQL = `
SELECT id, message_id::text, merchant_id::text, event_type, body, attempts, next_attempt_at, last_error, traceparent, created_at
FROM webhook_deliveries
WHERE status = 'pending' AND (lease_token IS NULL OR next_attempt_at <= now())
ORDER BY next_attempt_at, id
LIMIT $1
FOR UPDATE SKIP LOCKED`

// handOverCarrySQL continues the legacy delivery's schedule on the one
// Enqueue just recorded: its attempts so far, a retry not due yet, its
// last error.
const handOverCarrySQL = `
UPDATE webhook_endpoint_deliveries
SET attempts = $3, next_attempt_at = greatest(next_attempt_at, $4), last_error = $5
WHERE message_id = $1 AND endpoint_id = $2 AND status = 'pending'`

type legacyDelivery struct {
	id                   int64
	messageID, merchant  string
	eventType            string
	body                 []byte
	attempts             int
	nextAttempt, created time.Time
	lastError            *string
	traceparent          string
}

// handOverRound is what one round did: the legacy deliveries it marked
// moved, and the message ids of those it marked dead (HandOverOrphaned).
type handOverRound struct {
	moved    int
	orphaned []string
}

// HandOver moves, in one transaction, up to batch of the legacy
// deliveries (webhook_deliveries, written by NotifyMerchant and sent by
// [Sender]) that are pending and not in flight to the framework's webhook
// tables, and returns how many it marked 'moved' (app migration 00034).
//
// Each is recorded with [fanout.Enqueue] as the message the merchant's
// endpoint (id = merchant id, made by that migration) is sent: the same
// id (the webhook-id the merchant sees), type, time (the body's
// "timestamp") and payload (the body's "data"), schema version 1 and trace
// context; the delivery continues the legacy schedule (its attempts, its
// retry time, its last error). A message already in webhook_messages
// (moved before, or recorded by the framework's handler) is not recorded
// again: Enqueue does nothing for an id it has. The legacy row is marked
// 'moved' in the same transaction, so a message is in exactly one queue.
// One whose merchant's endpoint is gone is marked dead instead (see
// [HandOverOrphaned]).
//
// A legacy sender whose lease lapsed before its row moved settles nothing
// (its settle requires 'pending' and its token): the attempt is recorded
// with lease_lost. The merchant may then receive the message twice, with
// the same webhook-id, as a lapsed lease always allowed.
//
// Concurrent HandOvers, and legacy senders, take disjoint rows.
func HandOver(ctx context.Context, pool *pgxpool.Pool, batch int) (moved int, err error) {
	r, err := handOver(ctx, pool, batch)
	return r.moved, err
}

func handOver(ctx context.Context, pool *pgxpool.Pool, batch int) (handOverRound, error) {
	if batch < 1 {
		return handOverRound{}, errors.New("hand over webhook deliveries: batch must be at least 1")
	}
	var r handOverRound
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		r = handOverRound{}
		rows, err := tx.Query(ctx, handOverPickSQL, batch)
		if err != nil {
			return fmt.Errorf("pick legacy deliveries: %w", err)
		}
		ds, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (legacyDelivery, error) {
			var d legacyDelivery
			err := row.Scan(&d.id, &d.messageID, &d.merchant, &d.eventType, &d.body, &d.attempts, &d.nextAttempt,
				&d.lastError, &d.traceparent, &d.created)
			return d, err
		})
		if err != nil {
			return fmt.Errorf("pick legacy deliveries: %w", err)
		}
		var moved, dead []int64
		for _, d := range ds {
			ok, err := handOverOne(ctx, tx, d)
			if err != nil {
				return err
			}
			if ok {
				moved = append(moved, d.id)
			} else {
				dead = append(dead, d.id)
				r.orphaned = append(r.orphaned, d.messageID)
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE webhook_deliveries SET status = 'moved', lease_token = NULL WHERE id = ANY ($1)`, moved); err != nil {
			return fmt.Errorf("mark legacy deliveries moved: %w", err)
		}
		if _, err := tx.Exec(ctx, `UPDATE webhook_deliveries SET status = 'dead', lease_token = NULL, last_error = $2
			WHERE id = ANY ($1)`, dead, HandOverOrphaned); err != nil {
			return fmt.Errorf("mark orphaned legacy deliveries dead: %w", err)
		}
		r.moved = len(moved)
		return nil
	})
	if err != nil {
		return handOverRound{}, fmt.Errorf("hand over webhook deliveries: %w", err)
	}
	return r, nil
}

// handOverOne records d in the framework's tables and says whether it is
// there now (false: its merchant has no endpoint any more).
func handOverOne(ctx context.Context, tx pgx.Tx, d legacyDelivery) (bool, error) {
	m := webhooks.Message{ID: d.messageID, AccountID: d.merchant, EventType: d.eventType, SchemaVersion: 1}
	// NotifyMerchant wrote the envelope {"type", "timestamp", "data"}; a
	// body not in it (none is written so) is carried whole, at the row's
	// time, rather than lost.
	var env struct {
		Timestamp *time.Time      `json:"timestamp"`
		Data      json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(d.body, &env); err == nil && env.Timestamp != nil {
		m.OccurredAt, m.Payload = *env.Timestamp, env.Data
	} else {
		m.OccurredAt, m.Payload = d.created, d.body
	}
	res, err := fanout.Enqueue(ctx, tx, m, fanout.Target{Endpoints: []string{d.merchant}, AllTypes: true}, d.traceparent)
	if err != nil {
		return false, fmt.Errorf("legacy delivery %d: %w", d.id, err)
	}
	if res.Recorded {
		if _, err := tx.Exec(ctx, handOverCarrySQL, d.messageID, d.merchant, d.attempts, d.nextAttempt, d.lastError); err != nil {
			return false, fmt.Errorf("legacy delivery %d: carry its schedule over: %w", d.id, err)
		}
		return true, nil
	}
	// Not recorded: the message is there already (nothing more to do), or
	// no endpoint took it.
	var there bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM webhook_messages WHERE id = $1)`, d.messageID).Scan(&there); err != nil {
		return false, fmt.Errorf("legacy delivery %d: %w", d.id, err)
	}
	return there, nil
}

// RunHandOver hands the legacy deliveries over ([HandOver], HandOverBatch
// at a time) every interval until ctx ends, then returns nil: run it
// beside the framework's sender for as long as a process of an earlier
// release may still record or send legacy deliveries. Each orphaned
// delivery is logged (message id) at Warn.
func RunHandOver(ctx context.Context, pool *pgxpool.Pool, interval time.Duration, logger *slog.Logger) error {
	if interval <= 0 {
		return errors.New("hand over webhook deliveries: interval must be positive")
	}
	if logger == nil {
		logger = slog.Default()
	}
	poll.Drain(ctx, interval, func(ctx context.Context) (int, error) {
		r, err := handOver(ctx, pool, HandOverBatch)
		if r.moved > 0 {
			logger.Info("legacy webhook deliveries handed over", "moved", r.moved)
		}
		for _, id := range r.orphaned {
			logger.Warn("legacy webhook delivery not handed over: its merchant's endpoint was deleted; marked dead",
				"message_id", id)
		}
		return r.moved + len(r.orphaned), err
	}, func(err error) { logger.Warn("hand over legacy webhook deliveries", "error", err.Error()) })
	return nil
}
