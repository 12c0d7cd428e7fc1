package sql

import (
	"context"
	"fmt"
	"sync"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/internal/backoff"
	"github.com/outflow-dev/outflow/internal/subloop"
)

// Waking subscriptions. After each Publish has committed, the forwarder's
// side sends one NOTIFY per topic of the batch on the schema's channel
// (payload: the topic), in a statement of its own: a NOTIFY takes a lock
// that every notifying commit of the cluster queues on, so it is never
// sent inside the forwarder's INSERT, let alone inside a business
// transaction. A worker holds one connection (outside the pool) in LISTEN
// and wakes the subscriptions of the topic named; polling every
// PollInterval remains the fallback (a lost LISTEN connection, a
// notification sent while it was reconnecting).

// sqlChannel is the notification channel of the tables in schema, cut to
// PostgreSQL's 63-byte identifiers (on a character boundary).
func sqlChannel(schema string) string {
	c := "outflow_sql:" + schema
	for len(c) > 63 {
		_, size := utf8.DecodeLastRuneInString(c)
		c = c[:len(c)-size]
	}
	return c
}

// sqlWakes is the backend's set of subscriptions to wake, per topic, and
// its LISTEN loop, started with the first subscription and stopped by the
// backend's Close.
type sqlWakes struct {
	mu      sync.Mutex
	subs    map[string]map[chan struct{}]bool
	started bool
	stop    context.CancelFunc
	wg      sync.WaitGroup
}

// watch registers a subscription of topic; its channel receives (without
// blocking the sender) when the topic may have new rows.
func (b *sqlBackend) watch(topic string) (<-chan struct{}, func()) {
	w := &b.wakes
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.subs == nil {
		w.subs = map[string]map[chan struct{}]bool{}
	}
	if w.subs[topic] == nil {
		w.subs[topic] = map[chan struct{}]bool{}
	}
	w.subs[topic][ch] = true
	if !w.started {
		w.started = true
		ctx, cancel := context.WithCancel(context.Background())
		w.stop = cancel
		w.wg.Go(func() { b.listenLoop(ctx) })
	}
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.subs[topic], ch)
	}
}

// wake signals the subscriptions of topic, or of every topic when topic is
// "".
func (w *sqlWakes) wake(topic string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for t, chans := range w.subs {
		if topic != "" && t != topic {
			continue
		}
		for ch := range chans {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

// close stops the LISTEN loop and waits for it.
func (w *sqlWakes) close() {
	w.mu.Lock()
	stop := w.stop
	w.mu.Unlock()
	if stop != nil {
		stop()
	}
	w.wg.Wait()
}

func (b *sqlBackend) listenLoop(ctx context.Context) {
	for attempt := 1; ctx.Err() == nil; attempt++ {
		err := b.listen(ctx)
		if ctx.Err() != nil {
			return
		}
		d := backoff.Reconnect(attempt)
		b.cfg.Logger.Warn("sql broker: LISTEN connection lost; subscriptions poll meanwhile", "error", err, "retry_in", d)
		if !subloop.Sleep(ctx, d) {
			return
		}
	}
}

// listen holds a connection of its own in LISTEN (not the pool's: the pool
// is sized for the subscriptions' transactions) until it fails or ctx ends.
func (b *sqlBackend) listen(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, b.pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{b.channel}.Sanitize()); err != nil {
		return fmt.Errorf("listen on %q: %w", b.channel, err)
	}
	// Rows may have committed while nobody listened.
	b.wakes.wake("")
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		b.wakes.wake(n.Payload)
	}
}

// notify wakes the subscriptions of topics, in every process, after their
// rows committed. A failure only delays them until their next poll.
func (b *sqlBackend) notify(ctx context.Context, topics []string) {
	if _, err := b.pool.Exec(ctx, `SELECT pg_notify($1, t) FROM unnest($2::text[]) t`, b.channel, topics); err != nil && ctx.Err() == nil {
		b.cfg.Logger.Debug("sql broker: NOTIFY failed; subscriptions see the rows at their next poll", "error", err)
	}
}
