package outbox

import (
	"context"
	"errors"
	"fmt"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// batchExecutor lets the Watermill SQL publisher write into a pgx.Batch: its
// Exec queues the INSERT instead of running it, and checks the row count when
// the batch's results are read.
type batchExecutor struct {
	b *pgx.Batch
}

var _ wmsql.ContextExecutor = batchExecutor{}

func (e batchExecutor) ExecContext(_ context.Context, query string, args ...any) (wmsql.Result, error) {
	// The INSERT has one row per 9 arguments (see SchemaAdapter.InsertQuery).
	want := int64(len(args) / len(insertColumnList))
	e.b.Queue(query, args...).Exec(func(ct pgconn.CommandTag) error {
		if ct.RowsAffected() != want {
			return fmt.Errorf("outbox: inserted %d rows, want %d", ct.RowsAffected(), want)
		}
		return nil
	})
	return queuedResult(want), nil
}

func (batchExecutor) QueryContext(context.Context, string, ...any) (wmsql.Rows, error) {
	return nil, errors.New("outbox: a query cannot be queued on a batch")
}

type queuedResult int64

func (r queuedResult) RowsAffected() (int64, error) { return int64(r), nil }
