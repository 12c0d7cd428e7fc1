package handlers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/consumer"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/brokers"
	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks/sender"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// duplicatingBroker publishes every batch through the real broker, and the
// first few twice: the consumers see duplicates, as after a forwarder crash.
type duplicatingBroker struct {
	forwarder.Broker
	left atomic.Int32
}

func (d *duplicatingBroker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	if d.left.Add(-1) >= 0 {
		d.Broker.Publish(ctx, msgs)
	}
	return d.Broker.Publish(ctx, msgs)
}

type pipeline struct {
	schema  *outflowtest.Schema
	rdb     *redis.Client
	prefix  string
	svc     *app.Service
	backend brokers.Backend // nil: Redis at the test URL, streams under prefix
}

// testBackend opens one backend for a test, isolated (own stream, subject,
// queue or table names, deleted afterwards).
type testBackend struct {
	kind brokers.Kind
	open func(t *testing.T) brokers.Backend
}

// backends lists each backend the end-to-end suite runs on; files
// e2e_<kind>_test.go add theirs in init.
var backends = []testBackend{
	{brokers.Redis, func(t *testing.T) brokers.Backend {
		prefix := testservers.UniqueName(t, testservers.Redis(t)) + ":"
		return openBackend(t, brokers.Config{Kind: brokers.Redis, StreamPartitions: 2,
			Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: prefix}})
	}},
	{brokers.NATS, func(t *testing.T) brokers.Backend {
		return openBackend(t, brokers.Config{Kind: brokers.NATS, StreamPartitions: 2,
			NATS: brokers.NATSConfig{URL: testservers.NATSURL(), StreamPrefix: testservers.NATSPrefix(t)}})
	}},
}

func openBackend(t *testing.T, cfg brokers.Config) brokers.Backend {
	t.Helper()
	cfg.Logger = quiet
	b, err := brokers.Open(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
}

func newPipeline(t *testing.T) *pipeline {
	t.Helper()
	p := &pipeline{schema: outflowtest.NewSchema(t, appmigrations.Sets()...), rdb: testservers.Redis(t)}
	p.prefix = testservers.UniqueName(t, p.rdb) + ":"
	w, err := outbox.NewWriter(outbox.Config{Routes: app.Routes})
	require.NoError(t, err)
	p.svc, err = app.NewService(app.Config{Pool: p.schema.Pool, Events: w, AllowPrivateWebhooks: true}) // merchants on httptest servers
	require.NoError(t, err)
	return p
}

func (p *pipeline) runForwarder(t *testing.T, dupBatches int32) {
	t.Helper()
	var b forwarder.Broker
	system := string(brokers.Redis)
	if p.backend != nil {
		b, system = p.backend.Broker(), string(p.backend.Kind())
	} else {
		rb, err := redisstreams.New(redisstreams.Config{Client: p.rdb, StreamPrefix: p.prefix, StreamPartitions: 2})
		require.NoError(t, err)
		b = rb
	}
	db := &duplicatingBroker{Broker: b}
	db.left.Store(dupBatches)
	f, err := forwarder.New(forwarder.Config{Pool: p.schema.Pool, Broker: db, MessagingSystem: system, PollInterval: 50 * time.Millisecond, BatchSize: 20, Logger: quiet})
	require.NoError(t, err)
	run(t, f.Run)
}

// workerBackend is p.backend, opened on first use when the test set none:
// Redis at the test URL, p.prefix's two partitions per topic, the streams
// runForwarder publishes to.
func (p *pipeline) workerBackend(t *testing.T) brokers.Backend {
	t.Helper()
	if p.backend == nil {
		p.backend = openBackend(t, brokers.Config{Kind: brokers.Redis, StreamPartitions: 2,
			Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: p.prefix}})
	}
	return p.backend
}

func (p *pipeline) worker(t *testing.T, claimIdle time.Duration, extra ...consumer.Handler) *consumer.Worker {
	t.Helper()
	reg := events.NewRegistry()
	require.NoError(t, paymentevents.Register(reg))
	w, err := consumer.NewWorker(consumer.WorkerConfig{
		Pool: p.schema.Pool, Broker: p.workerBackend(t), Registry: reg, ClaimIdle: claimIdle, Logger: quiet,
	})
	require.NoError(t, err)
	require.NoError(t, w.Add(handlers.SyncAnalytics()))
	require.NoError(t, w.Add(handlers.NotifyMerchant(p.schema.Pool, handlers.NotifyConfig{})))
	for _, h := range extra {
		require.NoError(t, w.Add(h))
	}
	return w
}

// countingHandler is a consumer whose effect, in its transaction, is a row
// per message it applied, with the time it ran; counted reads them back per
// message. The table has no unique constraint: a second effect of one
// message shows as a count of 2. (A handler may run more than once when its
// transaction rolls back, a shared batch's included: what must happen once
// is the committed effect.)
func countingHandler(t *testing.T, p *pipeline) (consumer.Handler, func() map[string]int) {
	t.Helper()
	_, err := p.schema.Pool.Exec(context.Background(), `CREATE TABLE counted (message_id text NOT NULL, applied_at timestamptz NOT NULL)`)
	require.NoError(t, err)
	h := consumer.Handler{Name: "counter", Topic: app.PaymentsTopic, Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO counted (message_id, applied_at) VALUES ($1, $2)`, ev.MessageID, time.Now())
		return err
	}}
	return h, func() map[string]int {
		return countsBy(t, p.schema.Pool, `SELECT message_id, count(*) FROM counted GROUP BY message_id`)
	}
}

// countsBy runs q, which selects a key and a count, and returns the counts
// by key.
func countsBy(t *testing.T, pool *pgxpool.Pool, q string) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), q)
	require.NoError(t, err)
	out := map[string]int{}
	var (
		key string
		n   int
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &n}, func() error {
		out[key] = n
		return nil
	})
	require.NoError(t, err)
	return out
}

// messageIDs returns the outbox's message ids, of the given event types
// (all when none), each mapped to its event type.
func (p *pipeline) messageIDs(t *testing.T, types ...string) map[string]string {
	t.Helper()
	rows, err := p.schema.Pool.Query(context.Background(),
		`SELECT message_id::text, event_type FROM outbox WHERE coalesce(cardinality($1::text[]), 0) = 0 OR event_type = ANY($1)`, types)
	require.NoError(t, err)
	out := map[string]string{}
	for rows.Next() {
		var id, typ string
		require.NoError(t, rows.Scan(&id, &typ))
		out[id] = typ
	}
	require.NoError(t, rows.Err())
	return out
}

// requireCountedOnce waits until the counter has applied every event in the
// outbox, then checks that it applied exactly those, each once.
func (p *pipeline) requireCountedOnce(t *testing.T, counted func() map[string]int) {
	t.Helper()
	want := map[string]int{}
	for id := range p.messageIDs(t) {
		want[id] = 1
	}
	outflowtest.WaitFor(t, 30*time.Second, "the counter to apply every event", func() bool {
		got := counted()
		for id := range want {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
	wrong := map[string]int{} // message id -> times applied, when not once
	for id, n := range counted() {
		if want[id] != n {
			wrong[id] = n
		}
	}
	require.Empty(t, wrong, "each event's effect committed exactly once, and no other")
}

// merchantSite is a merchant's webhook endpoint: what it receives is the
// end-to-end effect of NotifyMerchant and the sender.
type merchantSite struct {
	mu       sync.Mutex
	secret   string
	received map[string][]string // webhook-id -> the body's type, per receipt
	unsigned []string            // webhook-ids whose signature did not verify
	traces   map[string]string   // webhook-id -> the last receipt's traceparent header
}

// newMerchant creates a merchant whose webhooks go to a server of the
// test's own, and runs a sender until the test ends.
func (p *pipeline) newMerchant(t *testing.T) (app.CreatedMerchant, *merchantSite) {
	t.Helper()
	site := &merchantSite{received: map[string][]string{}, traces: map[string]string{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		var b struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(body, &b)
		id := r.Header.Get("webhook-id")
		site.mu.Lock()
		defer site.mu.Unlock()
		site.received[id] = append(site.received[id], b.Type)
		site.traces[id] = r.Header.Get("traceparent")
		if !verify(site.secret, r.Header, body) {
			site.unsigned = append(site.unsigned, id)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close) // after the sender stops: cleanups run last first
	m, err := p.svc.CreateMerchant(context.Background(), app.NewMerchant{Name: "Shop", WebhookURL: srv.URL + "/hooks"})
	require.NoError(t, err)
	site.mu.Lock()
	site.secret = m.WebhookSecret
	site.mu.Unlock()
	run(t, newWebhookSender(p, sender.Config{}).Run)
	return m, site
}

// newWebhookSender is the webhook package's sender on p's database, as the
// worker runs it: the merchants' endpoints are httptest servers
// (AllowPrivate), and a zero cfg field is the sender's default.
func newWebhookSender(p *pipeline, cfg sender.Config) *sender.Sender {
	cfg.AllowPrivate = true
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	return sender.New(p.schema.Pool, cfg)
}

// requireWebhooks waits until the merchant has received a webhook for every
// paid or refunded event and the sender has nothing left to send, then
// checks that the merchant received exactly those: each once, with its
// event's type, signed with its secret.
func (s *merchantSite) requireWebhooks(t *testing.T, p *pipeline) {
	t.Helper()
	want := p.messageIDs(t, paymentevents.PaidType, paymentevents.RefundedType)
	require.NotEmpty(t, want)
	// The bound is generous: the caller waited for the projection, not
	// for NotifyMerchant, whose group may still be rejoining its broker
	// after an outage on a loaded machine (a Kafka rebalance alone takes
	// seconds), before the sender's work starts.
	// Measured: on the kafka backend at load 8, 10 of 28 events were still
	// unhandled by NotifyMerchant a minute after the projection was
	// complete (none pending to send), hence two minutes.
	// What was still missing at the last look, said if the wait fails.
	var state string
	t.Cleanup(func() {
		if t.Failed() && state != "" {
			t.Logf("webhooks at the last look: %s", state)
		}
	})
	outflowtest.WaitFor(t, 2*time.Minute, "a webhook for every paid or refunded event, and none left to send", func() bool {
		s.mu.Lock()
		missing := 0
		for id := range want {
			if len(s.received[id]) == 0 {
				missing++
			}
		}
		s.mu.Unlock()
		var left string
		require.NoError(t, p.schema.Pool.QueryRow(context.Background(),
			`SELECT coalesce(string_agg(status || ': ' || n, ', '), 'none') FROM
			 (SELECT status, count(*) n FROM webhook_endpoint_deliveries WHERE status <> 'delivered' GROUP BY 1) d`).Scan(&left))
		state = fmt.Sprintf("%d of %d events without a webhook received; deliveries not delivered: %s", missing, len(want), left)
		return missing == 0 && left == "none"
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	got := map[string]string{}
	for id, types := range s.received {
		require.Len(t, types, 1, "webhook %s received %d times", id, len(types))
		got[id] = types[0]
	}
	require.Equal(t, want, got, "one webhook per paid or refunded event, of its type, and no other")
	require.Empty(t, s.unsigned, "webhooks whose signature does not verify")
}

func run(t *testing.T, fn func(context.Context) error) {
	start(t, fn)
}

// start runs fn until the test ends or the returned function is called.
func start(t *testing.T, fn func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(stop)
	return stop
}

// drive creates payments and moves them; it returns what the projection
// must show.
func (p *pipeline) drive(t *testing.T, merchantID string, n int) app.CurrencyStats {
	t.Helper()
	ctx := context.Background()
	want := app.CurrencyStats{Currency: "EUR"}
	for i := range n {
		pay, err := p.svc.CreatePayment(ctx, app.NewPayment{MerchantID: merchantID, Amount: int64(100 + i), Currency: "EUR"})
		require.NoError(t, err)
		if i%5 == 0 {
			continue // stays pending
		}
		_, err = p.svc.Pay(ctx, pay.ID)
		require.NoError(t, err)
		want.PaidCount++
		want.PaidAmount = want.PaidAmount.Add(pay.Amount)
		if i%3 == 0 {
			half := pay.Amount / 2
			_, err = p.svc.Refund(ctx, pay.ID, &half)
			require.NoError(t, err)
			_, err = p.svc.Refund(ctx, pay.ID, nil)
			require.NoError(t, err)
			want.RefundedAmount = want.RefundedAmount.Add(pay.Amount)
		}
	}
	return want
}

func (p *pipeline) stats(t *testing.T, merchantID string) app.CurrencyStats {
	t.Helper()
	st, err := p.svc.GetMerchantStats(context.Background(), merchantID)
	require.NoError(t, err)
	if len(st.ByCurrency) == 0 {
		return app.CurrencyStats{Currency: "EUR"}
	}
	return st.ByCurrency[0]
}

// Outbox -> forwarder (publishing some batches twice) -> broker -> a
// worker stopped mid-run and another: every event delivered, each one's
// effect exactly once, on every backend.
func TestPipelineExactlyOnceDespiteDuplicates(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(string(b.kind), func(t *testing.T) {
			t.Parallel()
			p := newPipeline(t)
			p.backend = b.open(t)
			exactlyOnce(t, p)
		})
	}
}

func exactlyOnce(t *testing.T, p *pipeline) {
	m, site := p.newMerchant(t)
	counter, counted := countingHandler(t, p)
	want := p.drive(t, m.ID, 60)
	p.runForwarder(t, 3)

	// The first worker stops once it has handled some of the events (a
	// graceful stop: what it held unacknowledged is redelivered to the next
	// after the claim time; kill -9 of a worker is
	// TestKilledWorkerLosesNothing in cmd/outflow/internal/cli, on the real binary); a
	// second one, with another instance id, finishes.
	first := p.worker(t, time.Second, counter)
	ctx, stop := context.WithCancel(context.Background())
	firstDone := make(chan error, 1)
	go func() { firstDone <- first.Run(ctx) }()
	outflowtest.WaitFor(t, 30*time.Second, "the first worker to handle some events", func() bool {
		var n int
		require.NoError(t, p.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM consumer_aggregate_versions WHERE consumer = 'sync-analytics' AND version > 0`).Scan(&n))
		return n > 0
	})
	stop()
	require.NoError(t, <-firstDone)
	run(t, p.worker(t, time.Second, counter).Run)

	// The effects: the projection holds the payments' sums (a paid or
	// refunded event applied twice or never would show in them), the
	// counter committed one row per event, the merchant got one webhook per
	// paid or refunded event.
	outflowtest.WaitFor(t, 30*time.Second, "the projection to match the payments", func() bool { return p.stats(t, m.ID) == want })
	p.requireCountedOnce(t, counted)
	site.requireWebhooks(t, p)
	require.Equal(t, want, p.stats(t, m.ID), "the projection still matches the payments")
}

// A consumer that died holding messages (read, never acknowledged) has
// them claimed by another only after ClaimIdle: the live worker applies a
// newer event at once but the dead one's entries only once they have been
// idle that long, then each exactly once.
func TestDeadConsumersMessagesAreClaimed(t *testing.T) {
	t.Parallel()
	// Far above the worker's start-up, so that a claim ignoring the idle
	// time shows.
	const claimIdle = 3 * time.Second
	p := newPipeline(t)
	ctx := context.Background()
	m, err := p.svc.CreateMerchant(ctx, app.NewMerchant{Name: "Shop", WebhookURL: "https://shop.example/h"})
	require.NoError(t, err)
	counter, counted := countingHandler(t, p)
	want := p.drive(t, m.ID, 10)
	p.runForwarder(t, 0)
	streams := brokers.PartitionTopics(p.prefix, app.PaymentsTopic, 2)
	onStreams := func(n int) func() bool {
		return func() bool {
			var total int
			for _, s := range streams {
				l, err := p.rdb.XLen(ctx, s).Result()
				require.NoError(t, err)
				total += int(l)
			}
			return total == n
		}
	}
	events := p.events(t)
	outflowtest.WaitFor(t, 20*time.Second, "events on the streams", onStreams(events))

	// The dead consumer: reads every entry in each handler's group,
	// acknowledges nothing, never comes back.
	groups := []string{"sync-analytics", "notify-merchant", "counter"}
	readAt := time.Now()
	for _, g := range groups {
		var read int
		for _, s := range streams {
			require.NoError(t, p.rdb.XGroupCreateMkStream(ctx, s, g, "0").Err())
			res, err := p.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: g, Consumer: "dead", Streams: []string{s, ">"}, Count: 1000}).Result()
			require.NoError(t, err)
			read += len(res[0].Messages)
		}
		require.Equal(t, events, read, "the dead consumer holds every entry of %s", g)
	}
	// A newer event of another aggregate, on the streams before the worker
	// starts: its first read gets it.
	live, err := p.svc.CreatePayment(ctx, app.NewPayment{MerchantID: m.ID, Amount: 1, Currency: "EUR"})
	require.NoError(t, err)
	outflowtest.WaitFor(t, 20*time.Second, "the newer event on the streams", onStreams(events+1))

	run(t, p.worker(t, claimIdle, counter).Run)
	outflowtest.WaitFor(t, 30*time.Second, "the dead consumer's messages applied", func() bool { return p.stats(t, m.ID) == want })
	p.requireCountedOnce(t, counted)
	for _, g := range groups {
		outflowtest.WaitFor(t, 10*time.Second, "every entry of "+g+" acknowledged", func() bool {
			var pending int64
			for _, s := range streams {
				xp, err := p.rdb.XPending(ctx, s, g).Result()
				require.NoError(t, err)
				pending += xp.Count
			}
			return pending == 0
		})
	}

	var liveApplied, firstClaimed time.Time
	require.NoError(t, p.schema.Pool.QueryRow(ctx, `
		SELECT (SELECT c.applied_at FROM counted c JOIN outbox o ON o.message_id::text = c.message_id WHERE o.aggregate_id = $1),
		       (SELECT min(c.applied_at) FROM counted c JOIN outbox o ON o.message_id::text = c.message_id WHERE o.aggregate_id <> $1)`,
		live.ID).Scan(&liveApplied, &firstClaimed))
	require.True(t, liveApplied.Before(firstClaimed),
		"the worker was reading (applied the newer event at %s) while it left the dead consumer's entries alone (first applied at %s)",
		liveApplied.Format(time.StampMilli), firstClaimed.Format(time.StampMilli))
	require.GreaterOrEqual(t, firstClaimed.Sub(readAt), claimIdle, "claimed only after ClaimIdle")
	t.Logf("dead consumer's entries first applied %s after its read (ClaimIdle %s)", firstClaimed.Sub(readAt).Round(time.Millisecond), claimIdle)
}
