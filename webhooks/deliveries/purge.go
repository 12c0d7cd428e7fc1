package deliveries

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/internal/advisory"
	"github.com/outflow-dev/outflow/internal/retention"
	"github.com/outflow-dev/outflow/webhooks"
)

// purgeDeliveriesSQL deletes up to $2 settled deliveries created before
// $1, oldest first (webhook_endpoint_deliveries_settled_idx), skipping
// those another transaction holds; their attempts go with them (ON DELETE
// CASCADE). A delivery made pending again meanwhile is not settled any
// more when its lock is taken, and stays. It then locks their messages,
// in id order (two purges never wait on each other in a cycle), and
// returns them: see purgeMessagesSQL.
const purgeDeliveriesSQL = `
WITH scan AS (
    SELECT id FROM webhook_endpoint_deliveries
    WHERE status <> 'pending' AND created_at < $1
    ORDER BY created_at LIMIT $2
    FOR UPDATE SKIP LOCKED
), del AS (
    DELETE FROM webhook_endpoint_deliveries d USING scan s WHERE d.id = s.id RETURNING d.message_id
), msgs AS (
    SELECT m.id FROM webhook_messages m WHERE m.id IN (SELECT message_id FROM del) ORDER BY m.id FOR UPDATE
)
SELECT (SELECT count(*) FROM del), coalesce((SELECT array_agg(id) FROM msgs), '{}')`

// purgeMessagesSQL deletes those of messages $1 left without any
// delivery. It is a statement of its own, after purgeDeliveriesSQL
// locked them: its snapshot is taken once the locks are held, so of two
// purges that deleted a message's last two deliveries at once, the one
// that waited for the other's lock sees both gone and deletes the
// message (in one statement, both would see the other's delivery still
// there, and the message would stay forever). A message with any
// delivery left, pending or not, stays.
const purgeMessagesSQL = `
DELETE FROM webhook_messages m WHERE m.id = ANY ($1::uuid[])
    AND NOT EXISTS (SELECT 1 FROM webhook_endpoint_deliveries d WHERE d.message_id = m.id)`

// Purge deletes the settled (delivered or failed) deliveries created
// before cutoff, with their attempts (which hold the response bodies),
// and the messages (which hold the payloads) left without any delivery,
// in transactions of at most batch deliveries, oldest first, until none
// is left. Pending deliveries are never deleted, nor a message one of
// whose deliveries is left. It returns how many deliveries and messages
// it deleted. Several purges may run at once: each skips the deliveries
// another holds.
//
// db must begin transactions ([*pgxpool.Pool], [*pgx.Conn]): short ones,
// so that a purge of millions neither holds locks nor keeps the vacuum
// from the rows it deleted for long.
func Purge(ctx context.Context, db webhooks.DB, cutoff time.Time, batch int) (deliveries, messages int, err error) {
	if batch < 1 {
		return 0, 0, errors.New("purge webhook deliveries: batch must be at least 1")
	}
	b, ok := db.(advisory.Beginner) // a pool, a connection, a transaction (savepoints then)
	if !ok {
		return 0, 0, fmt.Errorf("purge webhook deliveries: db (%T) does not begin transactions: pass a pool or a connection", db)
	}
	var msgs int // of the batch in flight: counted once it committed
	job := retention.Job{Name: "webhook deliveries", DB: b, Tables: []retention.Table{{Name: "webhook deliveries",
		Batch: func(ctx context.Context, tx pgx.Tx, w *retention.Walk) (int64, bool, error) {
			dels, ids, err := purgeDeliveries(ctx, tx, w.Cutoff, batch)
			if msgs = 0; err == nil && len(ids) > 0 {
				msgs, err = purgeMessages(ctx, tx, ids)
			}
			return int64(dels), dels == batch, err
		}}},
		Deleted: func(string, int64) { messages += msgs }}
	n, err := job.Before(ctx, cutoff)
	return int(n), messages, err
}

// purgeDeliveries runs purgeDeliveriesSQL in tx: how many deliveries it
// deleted, and their messages, locked.
func purgeDeliveries(ctx context.Context, tx pgx.Tx, cutoff time.Time, batch int) (int, []string, error) {
	var n int
	var ids []string
	err := tx.QueryRow(ctx, purgeDeliveriesSQL, cutoff, batch).Scan(&n, &ids)
	return n, ids, err
}

// purgeMessages runs purgeMessagesSQL in tx, the next statement after
// purgeDeliveries: how many of messages it deleted.
func purgeMessages(ctx context.Context, tx pgx.Tx, messages []string) (int, error) {
	tag, err := tx.Exec(ctx, purgeMessagesSQL, messages)
	return int(tag.RowsAffected()), err
}
