package handlers

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// WebhookStats counts webhook deliveries not delivered.
type WebhookStats struct {
	// Pending deliveries wait for their first or next attempt.
	Pending int64 `json:"pending"`
	// Failing ones are pending after at least one failed attempt.
	Failing int64 `json:"failing"`
	// Dead ones gave up, waiting for an operator.
	Dead int64 `json:"dead"`
}

// ReadWebhookStats counts the deliveries of webhook_deliveries, the
// previous release's table (see [Sender]).
//
// Deprecated: this release's deliveries are in the webhook package's
// tables (`outflow stats` counts them); kept while the console reads it.
func ReadWebhookStats(ctx context.Context, pool *pgxpool.Pool) (WebhookStats, error) {
	return readWebhookStats(ctx, pool)
}

// WebhookStatsQuery counts pending, failing and dead deliveries one status
// at a time, so that each count reads its partial index
// (webhook_deliveries_due_idx, webhook_deliveries_dead_idx): `status IN
// ('pending', 'dead')` reads every settled delivery instead. Exported for
// the console's check of its plans.
const WebhookStatsQuery = `
	SELECT (SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'),
	       (SELECT count(*) FROM webhook_deliveries WHERE status = 'pending' AND attempts > 0),
	       (SELECT count(*) FROM webhook_deliveries WHERE status = 'dead')`

// readWebhookStats reads them on db: the pool, or the stats exporter's
// locked connection.
func readWebhookStats(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (WebhookStats, error) {
	var s WebhookStats
	if err := db.QueryRow(ctx, WebhookStatsQuery).Scan(&s.Pending, &s.Failing, &s.Dead); err != nil {
		return s, fmt.Errorf("webhook stats: %w", err)
	}
	return s, nil
}
