package handlers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// purgeWebhooksSQL deletes up to $2 settled (delivered or dead) deliveries
// created before $1, oldest first (webhook_deliveries_settled_idx), with
// their attempts. Pending deliveries are kept whatever their age: they are
// still to send.
const purgeWebhooksSQL = `
WITH scan AS (
    SELECT id FROM webhook_deliveries WHERE status <> 'pending' AND created_at < $1
    ORDER BY created_at LIMIT $2
    FOR UPDATE SKIP LOCKED
), att AS (
    DELETE FROM webhook_attempts a USING scan s WHERE a.delivery_id = s.id RETURNING 1
), del AS (
    DELETE FROM webhook_deliveries d USING scan s WHERE d.id = s.id RETURNING 1
)
SELECT (SELECT count(*) FROM scan), (SELECT count(*) FROM del), (SELECT count(*) FROM att)`

// PurgeWebhooks deletes the settled webhook deliveries (delivered or dead)
// created before cutoff and their attempts (they hold the bodies), in
// transactions of at most batch deliveries, and returns how many
// deliveries and attempts it deleted. Pending deliveries are never
// deleted. The worker runs it with the consumers' retention
// (--processed-retention).
func PurgeWebhooks(ctx context.Context, pool *pgxpool.Pool, cutoff time.Time, batch int) (deliveries, attempts int, err error) {
	if batch < 1 {
		return 0, 0, errors.New("purge webhooks: batch must be at least 1")
	}
	for {
		var scanned, dels, atts int
		if err := pool.QueryRow(ctx, purgeWebhooksSQL, cutoff, batch).Scan(&scanned, &dels, &atts); err != nil {
			return deliveries, attempts, fmt.Errorf("purge webhooks: %w", err)
		}
		deliveries, attempts = deliveries+dels, attempts+atts
		if scanned < batch {
			return deliveries, attempts, nil
		}
	}
}
