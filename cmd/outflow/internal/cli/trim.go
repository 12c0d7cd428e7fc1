package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/internal/poll"
)

// trimLoop trims the streams of every topic the outbox has seen, keeping
// whatever a consumer group has not acknowledged.
func trimLoop(ctx context.Context, pool *pgxpool.Pool, broker brokers.TopicTrimmer, every time.Duration, logger *slog.Logger) {
	if every <= 0 {
		return
	}
	poll.Every(ctx, every, func(ctx context.Context) error {
		// Topics come from recent rows: a loose index scan would be exact,
		// but topics are few and this runs once a minute.
		rows, err := pool.Query(ctx, `SELECT DISTINCT topic FROM (SELECT topic FROM outbox ORDER BY id DESC LIMIT 10000) r`)
		if err != nil {
			return fmt.Errorf("read the outbox's topics: %w", err)
		}
		topics, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("read the outbox's topics: %w", err)
		}
		var errs []error
		for _, topic := range topics {
			n, err := broker.TrimTopic(ctx, topic)
			if err != nil {
				errs = append(errs, fmt.Errorf("topic %s: %w", topic, err))
			} else if n > 0 {
				logger.Debug("trimmed streams", "topic", topic, "entries", n)
			}
		}
		return errors.Join(errs...)
	}, poll.Warn(logger, "trim streams"))
}

// trimBrokerLoop has a broker that keeps every message (the sql backend)
// delete what every consumer group read, past its retention.
func trimBrokerLoop(ctx context.Context, tr brokers.Trimmer, every time.Duration, logger *slog.Logger) {
	if every <= 0 {
		return
	}
	poll.Every(ctx, every, func(ctx context.Context) error {
		n, err := tr.Trim(ctx)
		if n > 0 {
			logger.Debug("trimmed broker tables", "messages", n)
		}
		return err
	}, poll.Warn(logger, "trim broker tables"))
}
