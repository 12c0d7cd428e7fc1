package demo

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// progress prints, every second, what this run has written to the outbox,
// what the forwarder published, what the SyncAnalytics consumer handled and
// the age of the oldest pending row. The returned function stops it.
func progress(ctx context.Context, cfg Config, since time.Time) func() {
	pctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-t.C:
			}
			var written, forwarded, handled int64
			var lag float64
			err := cfg.Pool.QueryRow(pctx, `
				SELECT count(*), count(published_at),
				       (SELECT count(*) FROM processed_messages WHERE consumer = 'sync-analytics' AND processed_at >= $1),
				       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE published_at IS NULL)), 0)::float8
				FROM outbox WHERE created_at >= $1`, since).Scan(&written, &forwarded, &handled, &lag)
			if err != nil {
				continue // the report at the end says what matters
			}
			fmt.Fprintf(cfg.Out, "  written %6d   forwarded %6d   handled (sync-analytics) %6d   lag %5.0f ms\n",
				written, forwarded, handled, lag*1000)
		}
	})
	var once sync.Once
	return func() { once.Do(func() { cancel(); wg.Wait() }) }
}
