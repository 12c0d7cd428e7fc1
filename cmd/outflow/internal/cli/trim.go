package cli

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/brokers"
)

// trimLoop trims the streams of every topic the outbox has seen, keeping
// whatever a consumer group has not acknowledged.
func trimLoop(ctx context.Context, pool *pgxpool.Pool, broker brokers.TopicTrimmer, every time.Duration, logger *slog.Logger) {
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Topics come from recent rows: a loose index scan would be exact,
		// but topics are few and this runs once a minute.
		rows, err := pool.Query(ctx, `SELECT DISTINCT topic FROM (SELECT topic FROM outbox ORDER BY id DESC LIMIT 10000) r`)
		if err != nil {
			continue
		}
		topics, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			continue
		}
		for _, topic := range topics {
			if n, err := broker.TrimTopic(ctx, topic); err != nil {
				logger.Warn("trim streams", "topic", topic, "error", err.Error())
			} else if n > 0 {
				logger.Debug("trimmed streams", "topic", topic, "entries", n)
			}
		}
	}
}

// trimBrokerLoop has a broker that keeps every message (the sql backend)
// delete what every consumer group read, past its retention.
func trimBrokerLoop(ctx context.Context, tr brokers.Trimmer, every time.Duration, logger *slog.Logger) {
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n, err := tr.Trim(ctx); err != nil && ctx.Err() == nil {
			logger.Warn("trim broker tables", "error", err.Error())
		} else if n > 0 {
			logger.Debug("trimmed broker tables", "messages", n)
		}
	}
}
