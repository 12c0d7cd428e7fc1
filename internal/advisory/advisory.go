package advisory

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// TrySQL takes class $1's transaction-scoped lock for the current schema
// without waiting, and says whether it got it. Statements that must take
// it together with something else embed it.
const TrySQL = `SELECT pg_try_advisory_xact_lock($1, hashtext(current_schema()))`

// Beginner opens a transaction: a *pgxpool.Pool, a *pgx.Conn, a pgx.Tx (a
// savepoint).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Try takes c's transaction-scoped lock for the current schema in tx,
// without waiting: false when another session holds it. It is released
// when tx ends.
func Try(ctx context.Context, tx pgx.Tx, c Class) (bool, error) {
	var ok bool
	err := tx.QueryRow(ctx, TrySQL, c).Scan(&ok)
	return ok, err
}

// InTx runs one round of a single-instance job: fn, in a transaction of
// its own that holds c's lock for the current schema, committed when fn
// returns nil. It reports false, without running fn, when another session
// holds the lock.
func InTx(ctx context.Context, db Beginner, c Class, fn func(pgx.Tx) error) (bool, error) {
	var ok bool
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		if ok, err = Try(ctx, tx, c); err != nil || !ok {
			return err
		}
		return fn(tx)
	})
	return ok, err
}
