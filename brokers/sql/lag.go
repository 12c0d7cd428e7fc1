package sql

import (
	"context"
	"fmt"
	"time"

	"github.com/outflow-dev/outflow/brokers"
)

var _ brokers.LagReporter = (*sqlBackend)(nil)

// Lag counts the rows of topic's table past group's position in its
// offsets table, (last_processed_transaction_id, offset_acked), the order
// the subscriber reads in; the oldest age is that of the first of them, by
// its created_at. A group without a position yet starts at the table's
// beginning, so all of it lags; a table not created yet lags by nothing.
// It only reads: no table and no offsets row is created. Rows written by
// transactions still open are not counted (they are not visible yet).
func (b *sqlBackend) Lag(ctx context.Context, group, topic string) (brokers.Lag, error) {
	table := b.Topics(topic)[0]
	if err := checkSQLTopic(table); err != nil {
		return brokers.Lag{}, err
	}
	msgs, offs := b.schema.MessagesTable(table), b.offs.MessagesOffsetsTable(table)
	var exists bool
	if err := b.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL`, msgs, offs).Scan(&exists); err != nil {
		return brokers.Lag{}, fmt.Errorf("sql lag of %s on %s: %w", group, table, err)
	}
	if !exists {
		return brokers.Lag{}, nil
	}
	// created_at is a TIMESTAMP written with CURRENT_TIMESTAMP in the
	// writer's time zone: LOCALTIMESTAMP compares like with like (see Trim).
	var (
		n   int64
		age float64
	)
	err := b.pool.QueryRow(ctx, `WITH g AS (
			SELECT coalesce((SELECT last_processed_transaction_id FROM `+offs+` WHERE consumer_group = $1), '0'::xid8) AS xid,
			       coalesce((SELECT offset_acked FROM `+offs+` WHERE consumer_group = $1), 0) AS off)
		SELECT count(*), coalesce(extract(epoch FROM LOCALTIMESTAMP - min(m.created_at)), 0)::float8
		FROM `+msgs+` m, g WHERE (m.transaction_id, m."offset") > (g.xid, g.off)`, group).Scan(&n, &age)
	if err != nil {
		return brokers.Lag{}, fmt.Errorf("sql lag of %s on %s: %w", group, table, err)
	}
	lag := brokers.Lag{Events: n}
	if n > 0 {
		lag.OldestAge = max(time.Duration(age*float64(time.Second)), 0)
	}
	return lag, nil
}
