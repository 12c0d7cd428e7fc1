package idempotency

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DeadLetterCounts are one consumer's open dead letters by status.
type DeadLetterCounts struct {
	Held     int64 `json:"held"`
	Retrying int64 `json:"retrying"`
	Dead     int64 `json:"dead"`
}

// qDeadLetterCounts is ReadDeadLetterCounts' query.
const qDeadLetterCounts = `
	SELECT consumer, status, count(*) FROM dead_letters
	WHERE status IN ('retrying', 'dead', 'held') GROUP BY consumer, status`

// ReadDeadLetterCounts counts the open dead letters of every consumer that has
// any. One count per (consumer, status), which
// dead_letters_open_consumer_status_idx answers from the index alone
// (migration 00020), in the order of its key. Not one count(*) FILTER per
// status grouped by consumer: evaluating the filters tips the planner to a
// parallel plan, whose workers, on a busy machine, take longer to start
// than the count takes (60-80 ms against 6-7 ms for 66,000 open dead
// letters with the load average at 6 on 2 cores).
func ReadDeadLetterCounts(ctx context.Context, pool *pgxpool.Pool) (map[string]DeadLetterCounts, error) {
	rows, err := pool.Query(ctx, qDeadLetterCounts)
	if err != nil {
		return nil, fmt.Errorf("idempotency: count dead letters: %w", err)
	}
	out := map[string]DeadLetterCounts{}
	var (
		name, status string
		n            int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&name, &status, &n}, func() error {
		c := out[name]
		switch status {
		case "held":
			c.Held = n
		case "retrying":
			c.Retrying = n
		case "dead":
			c.Dead = n
		}
		out[name] = c
		return nil
	}); err != nil {
		return nil, fmt.Errorf("idempotency: count dead letters: %w", err)
	}
	return out, nil
}
