package webhooks

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the webhook packages run their statements on: a
// *pgxpool.Pool, a *pgx.Conn, or a pgx.Tx (the caller's transaction, for
// the ...Tx forms and the consumer handler).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
