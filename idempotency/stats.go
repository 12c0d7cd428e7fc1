package idempotency

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ParkedCounts are one consumer's open dead letters by status.
type ParkedCounts struct {
	Held     int64 `json:"held"`
	Retrying int64 `json:"retrying"`
	Dead     int64 `json:"dead"`
}

// ReadParkedCounts counts the open dead letters of every consumer that has
// any.
func ReadParkedCounts(ctx context.Context, pool *pgxpool.Pool) (map[string]ParkedCounts, error) {
	rows, err := pool.Query(ctx, `
		SELECT consumer,
		       count(*) FILTER (WHERE status = 'held'),
		       count(*) FILTER (WHERE status = 'retrying'),
		       count(*) FILTER (WHERE status = 'dead')
		FROM dead_letters WHERE status IN ('held', 'retrying', 'dead') GROUP BY consumer`)
	if err != nil {
		return nil, fmt.Errorf("idempotency: count dead letters: %w", err)
	}
	out := map[string]ParkedCounts{}
	var (
		name string
		c    ParkedCounts
	)
	if _, err := pgx.ForEachRow(rows, []any{&name, &c.Held, &c.Retrying, &c.Dead}, func() error {
		out[name] = c
		return nil
	}); err != nil {
		return nil, fmt.Errorf("idempotency: count dead letters: %w", err)
	}
	return out, nil
}
