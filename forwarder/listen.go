package forwarder

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// listenLoop holds one connection in LISTEN on this schema's outbox channel
// and wakes the worker on every notification. When the connection drops the
// worker still polls; the loop reconnects with a backoff.
func (f *Forwarder) listenLoop(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := f.listen(ctx)
		if ctx.Err() != nil {
			return
		}
		f.cfg.Logger.Warn("outbox LISTEN connection lost; polling meanwhile", "error", errString(err), "retry_in", backoff)
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

func (f *Forwarder) listen(ctx context.Context) error {
	conn, err := f.cfg.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// The connection leaves the pool for good: it is in LISTEN state.
	pc := conn.Hijack()
	defer pc.Close(context.WithoutCancel(ctx))

	var schema string
	if err := pc.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return err
	}
	if _, err := pc.Exec(ctx, "LISTEN "+pgx.Identifier{"outflow_outbox:" + schema}.Sanitize()); err != nil {
		return err
	}
	// Rows may have committed while we were not listening.
	f.notify()
	for {
		if _, err := pc.WaitForNotification(ctx); err != nil {
			return err
		}
		f.metrics.notifications.Inc()
		f.notify()
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
