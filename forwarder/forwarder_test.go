package forwarder_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// testPayload is a minimal event.
type testPayload struct {
	N   int    `json:"n"`
	Pad string `json:"pad,omitempty"`
}

func (testPayload) EventType() string { return "test.happened" }

type env struct {
	t      *testing.T
	schema *outflowtest.Schema
	redis  redis.UniversalClient
	topic  string
	broker *redisstreams.Broker
	writer *outbox.Writer
}

func setup(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, schema: outflowtest.NewSchema(t)}
	e.redis = testservers.Redis(t)
	e.topic = testservers.UniqueName(t, e.redis)
	e.useRedis(e.redis)
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": e.topic}})
	require.NoError(t, err)
	e.writer = w
	return e
}

func (e *env) useRedis(c redis.UniversalClient) {
	b, err := redisstreams.New(redisstreams.Config{Client: c})
	require.NoError(e.t, err)
	e.broker = b
}

func (e *env) config(mut ...func(*forwarder.Config)) forwarder.Config {
	cfg := forwarder.Config{
		Logger:           slog.New(slog.NewTextHandler(e.t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
		Pool:             e.schema.Pool,
		Broker:           e.broker,
		PollInterval:     50 * time.Millisecond,
		TakeoverAfter:    2 * time.Second,
		RetryBackoff:     10 * time.Millisecond,
		RetryBackoffMax:  50 * time.Millisecond,
		OutageBackoffMax: 200 * time.Millisecond,
	}
	for _, m := range mut {
		m(&cfg)
	}
	return cfg
}

// run starts a forwarder and returns a function that stops it and waits.
func (e *env) run(cfg forwarder.Config) (*forwarder.Forwarder, func()) {
	e.t.Helper()
	f, err := forwarder.New(cfg)
	require.NoError(e.t, err)
	return f, e.start(f)
}

// start runs f until the test ends or the returned function is called.
func (e *env) start(f *forwarder.Forwarder) func() {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			require.NoError(e.t, <-done)
		})
	}
	e.t.Cleanup(stop)
	return stop
}

// write commits one event per (aggregate, version) in its own transaction.
func (e *env) write(aggregate string, version int64, p testPayload) string {
	e.t.Helper()
	ctx := context.Background()
	ev, err := events.New(ctx, events.Aggregate{Type: "test", ID: aggregate, Version: version}, p)
	require.NoError(e.t, err)
	require.NoError(e.t, pgx.BeginFunc(ctx, e.schema.Pool, func(tx pgx.Tx) error {
		return e.writer.PublishTx(ctx, tx, ev)
	}))
	return ev.MessageID
}

// writeMany commits rounds × aggregates events, one transaction per round,
// versions 1..rounds per aggregate.
func (e *env) writeMany(aggs []string, fromVersion, rounds int) {
	e.t.Helper()
	ctx := context.Background()
	for r := range rounds {
		evs := make([]events.Event, 0, len(aggs))
		for _, a := range aggs {
			ev, err := events.New(ctx, events.Aggregate{Type: "test", ID: a, Version: int64(fromVersion + r)}, testPayload{N: fromVersion + r})
			require.NoError(e.t, err)
			evs = append(evs, ev)
		}
		require.NoError(e.t, pgx.BeginFunc(ctx, e.schema.Pool, func(tx pgx.Tx) error {
			return e.writer.PublishTx(ctx, tx, evs...)
		}))
	}
}

func aggregates(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("agg-%03d-%s", i, uuid.NewString()[:8])
	}
	return out
}

type entry struct {
	messageID string
	aggregate string
	version   int64
}

func (e *env) stream() []entry {
	e.t.Helper()
	msgs, err := e.redis.XRange(context.Background(), e.topic, "-", "+").Result()
	require.NoError(e.t, err)
	var out []entry
	um := redisstream.DefaultMarshallerUnmarshaller{}
	for _, m := range msgs {
		msg, err := um.Unmarshal(m.Values)
		require.NoError(e.t, err)
		env, err := events.EnvelopeFromMessage(msg)
		require.NoError(e.t, err)
		out = append(out, entry{messageID: env.MessageID, aggregate: env.AggregateID, version: env.AggregateVersion})
	}
	return out
}

// count counts the outbox rows where says, over their state as the
// forwarder sees it (the view outbox_state) under the columns' old names:
// published_at is set once the row's partition cursor passed it (at the
// lease tick after its publish), attempts, parked_at and the others come
// from outbox_failures.
func (e *env) count(where string) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.schema.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+outboxAsSeen+" WHERE "+where).Scan(&n))
	return n
}

const outboxAsSeen = `(SELECT o.id, o.message_id, o.topic, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.created_at,
       CASE WHEN s.published THEN coalesce(s.published_by, now()) END AS published_at,
       s.attempts, s.last_error, s.next_attempt_at, s.parked_at, s.discarded_at, s.state
FROM outbox o JOIN outbox_state s USING (id)) outbox`

// requireInOrder checks that every row reached the stream and that each
// aggregate's first deliveries come in version order (duplicates allowed).
func requireInOrder(t *testing.T, entries []entry, wantRows int) {
	t.Helper()
	seen := make(map[string]bool)
	last := make(map[string]int64)
	for _, en := range entries {
		if seen[en.messageID] {
			continue // a duplicate: at-least-once
		}
		seen[en.messageID] = true
		require.Equal(t, last[en.aggregate]+1, en.version, "aggregate %s: version %d after %d", en.aggregate, en.version, last[en.aggregate])
		last[en.aggregate] = en.version
	}
	require.Len(t, seen, wantRows, "distinct messages on the stream")
}

func TestForwardsEverythingInOrderInWatermillFormat(t *testing.T) {
	t.Parallel()
	e := setup(t)
	aggs := aggregates(20)
	e.writeMany(aggs, 1, 10)
	e.run(e.config(func(c *forwarder.Config) { c.BatchSize = 37 }))

	outflowtest.WaitFor(t, 20*time.Second, "every row published", func() bool { return e.count("published_at IS NULL") == 0 })
	entries := e.stream()
	requireInOrder(t, entries, 200)
	require.Len(t, entries, 200, "no duplicate without a crash")

	// A Watermill subscriber reads the entries with their envelope.
	msgs, err := e.redis.XRange(context.Background(), e.topic, "-", "+").Result()
	require.NoError(t, err)
	msg, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(msgs[0].Values)
	require.NoError(t, err)
	reg := events.NewRegistry()
	require.NoError(t, reg.Register(testPayload{}))
	ev, err := reg.DecodeMessage(msg)
	require.NoError(t, err)
	require.Equal(t, "test.happened", ev.EventType)
	require.Equal(t, testPayload{N: 1}, ev.Payload)

	s, err := forwarder.ReadStats(context.Background(), e.schema.Pool)
	require.NoError(t, err)
	require.Equal(t, forwarder.Stats{PublishedTotal: 200}, s)
}

// Transaction A takes the lower id but commits after B: claiming by state,
// not by an id cursor, forwards both.
func TestOutOfOrderCommitLosesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	e.run(e.config())

	evA, err := events.New(ctx, events.Aggregate{Type: "test", ID: "a", Version: 1}, testPayload{N: 1})
	require.NoError(t, err)
	txA, err := e.schema.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = txA.Rollback(ctx) })
	require.NoError(t, e.writer.PublishTx(ctx, txA, evA))

	idB := e.write("b", 1, testPayload{N: 2})
	outflowtest.WaitFor(t, 10*time.Second, "B on the stream", func() bool { return len(e.stream()) == 1 })
	require.Equal(t, idB, e.stream()[0].messageID)

	require.NoError(t, txA.Commit(ctx))
	outflowtest.WaitFor(t, 10*time.Second, "A on the stream", func() bool { return len(e.stream()) == 2 })
	require.Equal(t, evA.MessageID, e.stream()[1].messageID)

	var idA, idBrow int64
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT
		(SELECT id FROM outbox WHERE message_id = $1), (SELECT id FROM outbox WHERE message_id = $2)`,
		evA.MessageID, idB).Scan(&idA, &idBrow))
	require.Less(t, idA, idBrow, "A really had the lower id")
}

// crashingBroker publishes through the real broker, then reports an outage
// for the first N batches, as a forwarder that dies between the publish and
// the mark would: the rows stay pending and go out again.
type crashingBroker struct {
	forwarder.Broker
	mu      sync.Mutex
	crashes int
}

func (c *crashingBroker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	errs := c.Broker.Publish(ctx, msgs)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.crashes > 0 {
		c.crashes--
		for i := range errs {
			errs[i] = fmt.Errorf("%w: injected crash after publish", forwarder.ErrBrokerUnavailable)
		}
	}
	return errs
}

func TestCrashAfterPublishBeforeMarkDuplicatesNeverLoses(t *testing.T) {
	t.Parallel()
	e := setup(t)
	aggs := aggregates(5)
	e.writeMany(aggs, 1, 4)
	e.run(e.config(func(c *forwarder.Config) { c.Broker = &crashingBroker{Broker: e.broker, crashes: 2} }))

	outflowtest.WaitFor(t, 20*time.Second, "every row published", func() bool { return e.count("published_at IS NULL") == 0 })
	entries := e.stream()
	requireInOrder(t, entries, 20)
	require.Greater(t, len(entries), 20, "the crashed batches were published again")
	require.Zero(t, e.count("attempts > 0"), "a crash is not the rows' fault")
}

func TestPoisonRowParkedWhileOthersFlow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	poisonID := e.write("x", 1, testPayload{N: 1, Pad: strings.Repeat("p", 2000)})
	e.write("x", 2, testPayload{N: 2})
	others := aggregates(10)
	e.writeMany(others, 1, 3)

	_, stop := e.run(e.config(func(c *forwarder.Config) {
		c.MaxPayloadBytes = 1000
		c.MaxAttempts = 3
	}))
	outflowtest.WaitFor(t, 20*time.Second, "the poison row parked", func() bool { return e.count("parked_at IS NOT NULL") == 1 })
	outflowtest.WaitFor(t, 20*time.Second, "the other aggregates forwarded", func() bool { return len(e.stream()) == 30 })

	parked, err := forwarder.ListParked(context.Background(), e.schema.Pool, 10)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, poisonID, parked[0].MessageID)
	require.Equal(t, 1, parked[0].Attempts, "too large: parked at its first attempt, not retried up to MaxAttempts")
	require.Contains(t, parked[0].LastError, "exceeds MaxPayloadBytes 1000")
	for _, en := range e.stream() {
		require.NotEqual(t, "x", en.aggregate, "x v2 must wait behind its parked v1")
	}
	stop()

	// The operator fixes the cause (here: a larger limit) and retries.
	n, err := forwarder.RetryParked(context.Background(), e.schema.Pool, forwarder.ParkedFilter{})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	e.run(e.config())
	outflowtest.WaitFor(t, 20*time.Second, "x forwarded", func() bool { return e.count("published_at IS NULL") == 0 })
	requireInOrder(t, e.stream(), 32)
}

func TestRedisOutageBurnsNoAttempt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := testservers.StartRedis(t)
	opts, err := redis.ParseURL(srv.URL)
	require.NoError(t, err)
	opts.MaxRetries = -1
	opts.DialTimeout = 200 * time.Millisecond
	own := redis.NewClient(opts)
	t.Cleanup(func() { own.Close() })
	e.useRedis(own)
	e.redis = own

	aggs := aggregates(10)
	e.writeMany(aggs, 1, 5)
	reg := prometheus.NewRegistry()
	e.run(e.config(func(c *forwarder.Config) { c.MaxAttempts = 2; c.Registerer = reg }))
	outflowtest.WaitFor(t, 20*time.Second, "the first rows forwarded", func() bool { return e.count("published_at IS NULL") == 0 })

	srv.Stop()
	e.writeMany(aggs, 6, 5)
	// Several failed tries: enough to park every row with MaxAttempts 2,
	// had the outage counted against them.
	outflowtest.WaitFor(t, 20*time.Second, "several tries against the dead Redis", func() bool {
		return counter(t, reg, "outflow_forwarder_broker_unavailable_total") >= 4
	})
	require.Equal(t, 50, e.count("published_at IS NULL"), "nothing can be published while Redis is down")
	require.Zero(t, e.count("attempts > 0 OR parked_at IS NOT NULL"), "an outage burns no attempt and parks nothing")

	srv.Start()
	outflowtest.WaitFor(t, 30*time.Second, "the backlog drained", func() bool { return e.count("published_at IS NULL") == 0 })
	requireInOrder(t, e.stream(), 100)
}

// Wake is the in-process signal of a writer that shares the forwarder's
// process: with polls an hour apart, only Wake can bring the row.
func TestWakeWakesTheForwarder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	f, _ := e.run(e.config(func(c *forwarder.Config) { c.PollInterval, c.MinPollInterval = time.Hour, time.Hour }))
	outflowtest.WaitFor(t, 10*time.Second, "partitions leased", func() bool {
		return e.countPartitionsOwned() > 0
	})
	id := e.write("n", 1, testPayload{N: 1})
	f.Wake()
	outflowtest.WaitFor(t, 5*time.Second, "the row on the stream", func() bool { return len(e.stream()) == 1 })
	require.Equal(t, id, e.stream()[0].messageID)
}

// Without any wake, the adaptive poll finds a row committed after the
// forwarder went idle, within its PollInterval.
func TestPollFindsRowsWithoutWake(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.run(e.config(func(c *forwarder.Config) { c.PollInterval = 200 * time.Millisecond }))
	outflowtest.WaitFor(t, 10*time.Second, "partitions leased", func() bool {
		return e.countPartitionsOwned() > 0
	})
	for i := range 3 {
		e.write("p", int64(i+1), testPayload{N: i})
		outflowtest.WaitFor(t, 5*time.Second, "the row on the stream", func() bool { return len(e.stream()) == i+1 })
	}
	requireInOrder(t, e.stream(), 3)
}

func (e *env) countPartitionsOwned() int {
	var n int
	require.NoError(e.t, e.schema.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM outbox_partitions WHERE owner IS NOT NULL`).Scan(&n))
	return n
}

func TestConcurrentForwardersKeepPerAggregateOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	aggs := aggregates(200)
	for i := range 3 {
		e.run(e.config(func(c *forwarder.Config) {
			c.InstanceID = "instance-" + strconv.Itoa(i)
			c.BatchSize = 250
			c.LeaseRenewInterval = 200 * time.Millisecond
		}))
	}
	// Rows keep arriving while the three share the partitions.
	e.writeMany(aggs, 1, 100)
	outflowtest.WaitFor(t, 90*time.Second, "20k rows forwarded", func() bool { return e.count("published_at IS NULL") == 0 })
	requireInOrder(t, e.stream(), 20_000)

	var owners int
	require.NoError(t, e.schema.Pool.QueryRow(context.Background(),
		`SELECT count(DISTINCT owner) FROM outbox_partitions`).Scan(&owners))
	require.Equal(t, 3, owners, "the partitions are shared")
}

func TestGracefulShutdownReleasesPartitions(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, stop := e.run(e.config())
	outflowtest.WaitFor(t, 10*time.Second, "partitions leased", func() bool { return e.countPartitionsOwned() == 16 })
	stop()
	require.Zero(t, e.countPartitionsOwned(), "a stopped forwarder leaves nothing leased")

	// The next instance starts at once, without waiting for a lease to expire.
	e.run(e.config(func(c *forwarder.Config) { c.TakeoverAfter = time.Hour }))
	e.write("after", 1, testPayload{N: 1})
	outflowtest.WaitFor(t, 10*time.Second, "forwarded by the next instance", func() bool { return len(e.stream()) == 1 })
}

// A dead instance's partitions move to a live one once its leases expire.
func TestTakeoverOfADeadInstance(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	// A "dead" instance: leases that nobody renews.
	_, err := e.schema.Pool.Exec(ctx, `
		INSERT INTO outbox_partitions (partition, owner, lease_until)
		SELECT g, 'dead', now() + interval '2 seconds' FROM generate_series(0, 15) g`)
	require.NoError(t, err)
	_, err = e.schema.Pool.Exec(ctx, `INSERT INTO outbox_forwarders (id) VALUES ('dead')`)
	require.NoError(t, err)
	e.write("t", 1, testPayload{N: 1})

	start := time.Now()
	e.run(e.config(func(c *forwarder.Config) { c.TakeoverAfter = 2 * time.Second }))
	outflowtest.WaitFor(t, 10*time.Second, "the row forwarded after takeover", func() bool { return len(e.stream()) == 1 })
	took := time.Since(start)
	require.GreaterOrEqual(t, took, time.Second, "it waited for the dead leases")
	require.Less(t, took, 2*time.Second+2*time.Second, "within TakeoverAfter + LeaseRenewInterval, with slack")
}

// Config.Partitions makes the first set; afterwards instances follow the
// database's count, whatever theirs.
func TestPartitionCountFollowsTheDatabase(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, stop := e.run(e.config())
	outflowtest.WaitFor(t, 10*time.Second, "partitions created", func() bool { return e.countPartitionsOwned() == 16 })
	stop()
	require.NoError(t, forwarder.Repartition(context.Background(), e.schema.Pool, 8, 0))
	e.run(e.config(func(c *forwarder.Config) { c.Partitions = 16 }))
	e.write("r", 1, testPayload{N: 1})
	outflowtest.WaitFor(t, 10*time.Second, "forwarded with 8 partitions", func() bool { return len(e.stream()) == 1 })
	outflowtest.WaitFor(t, 10*time.Second, "the 8 leased", func() bool { return e.countPartitionsOwned() == 8 })
}

// The partition count changes twice while three instances run and
// producers write: every row goes out, each aggregate's events in order,
// though most aggregates move to another partition, and many to another
// instance, at each change.
func TestRepartitionOnlineKeepsOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	for i := range 3 {
		e.run(e.config(func(c *forwarder.Config) {
			c.InstanceID = "instance-" + strconv.Itoa(i)
			c.BatchSize = 50
			c.LeaseRenewInterval = 200 * time.Millisecond
		}))
	}
	outflowtest.WaitFor(t, 10*time.Second, "partitions leased", func() bool { return e.countPartitionsOwned() == 16 })
	aggs := aggregates(100)
	var (
		wg     sync.WaitGroup
		rounds atomic.Int64
		halt   atomic.Bool
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for r := 1; !halt.Load(); r++ {
			e.writeMany(aggs, r, 1)
			rounds.Store(int64(r))
		}
	}()
	sets := func() int { return e.countSQL(`SELECT count(*) FROM outbox_partition_sets`) }
	for _, n := range []int{5, 24} {
		at := rounds.Load()
		outflowtest.WaitFor(t, 20*time.Second, "rows flowing", func() bool { return rounds.Load() >= at+5 })
		from, err := forwarder.RepartitionOnline(ctx, e.schema.Pool, n)
		require.NoError(t, err)
		require.Positive(t, from)
		_, err = forwarder.RepartitionOnline(ctx, e.schema.Pool, n)
		require.ErrorIs(t, err, forwarder.ErrRepartitionInProgress)
		outflowtest.WaitFor(t, 60*time.Second, "the new set taking over", func() bool { return sets() == 1 })
		outflowtest.WaitFor(t, 20*time.Second, "its partitions leased", func() bool { return e.countPartitionsOwned() == n })
	}
	at := rounds.Load()
	outflowtest.WaitFor(t, 20*time.Second, "rows flowing", func() bool { return rounds.Load() >= at+5 })
	halt.Store(true)
	wg.Wait()
	total := int(rounds.Load()) * len(aggs)
	outflowtest.WaitFor(t, 90*time.Second, "every row forwarded", func() bool { return e.count("published_at IS NULL") == 0 })
	requireInOrder(t, e.stream(), total)
	var owners int
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT count(DISTINCT owner) FROM outbox_partitions`).Scan(&owners))
	require.Equal(t, 3, owners, "the 24 partitions shared")
}

// Retention drops whole partitions of the outbox: those whose rows are
// all published, none failing, and older than the retention; a partition
// with a parked row, one above the cursor or one with a recent row stays,
// row for row. No row is deleted.
func TestPurgeDropsOnlyOldPublishedPartitions(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	// Partitions of 10 ids from 20,000,000 on (the migration's first two
	// hold 10 million ids each).
	_, err := e.schema.Pool.Exec(ctx, `SELECT setval('outbox_id_seq', 19999999)`)
	require.NoError(t, err)
	aggs := aggregates(10)
	for r := range 5 {
		made, err := forwarder.EnsurePartitions(ctx, e.schema.Pool, 10)
		require.NoError(t, err)
		require.NotEmpty(t, made, "two partitions ahead of the ids")
		e.writeMany(aggs, r+1, 1)
	}
	// In id order, 10 to a partition: 20 old published rows, 5 old
	// parked, 10 old published, 10 recent published (the cursor of the
	// one lease partition is at the 45th row), 5 old but pending (above
	// the cursor).
	_, err = e.schema.Pool.Exec(ctx, `
		WITH r AS (SELECT id, aggregate_type, aggregate_id, row_number() OVER (ORDER BY id) AS n FROM outbox),
		c AS (UPDATE outbox o SET created_at = CASE WHEN r.n BETWEEN 36 AND 45 THEN now() ELSE now() - interval '20 days' END
		      FROM r WHERE o.id = r.id),
		f AS (INSERT INTO outbox_failures (id, aggregate_type, aggregate_id, kind, attempts, parked_at)
		      SELECT id, aggregate_type, aggregate_id, 'failed', 10, now() FROM r WHERE n BETWEEN 21 AND 25)
		INSERT INTO outbox_partitions (partition, published_through) SELECT 0, id FROM r WHERE n = 45;
		INSERT INTO outbox_partition_sets (first_id, base, count) VALUES (0, 0, 1)`)
	require.NoError(t, err)
	var ids []int64
	rows, err := e.schema.Pool.Query(ctx, `SELECT id FROM outbox ORDER BY id`)
	require.NoError(t, err)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Len(t, ids, 50)
	partitionOf := func(id int64) string {
		var name string
		require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM outbox WHERE id = $1`, id).Scan(&name))
		return name
	}
	parkedPart := partitionOf(ids[20])

	// Receipts of the broker audit: 10 older than the retention (a
	// consumer group that stopped long ago kept them unsettled), 3 newer.
	_, err = e.schema.Pool.Exec(ctx, `
		INSERT INTO outbox_receipts (published_at, outbox_ids, broker_topics, positions)
		SELECT now() - CASE WHEN g <= 10 THEN interval '16 days' ELSE interval '0' END, ARRAY[g::bigint], ARRAY['s'], ARRAY[g::text]
		FROM generate_series(1, 13) g`)
	require.NoError(t, err)

	_, err = forwarder.Purge(ctx, e.schema.Pool, 15*24*time.Hour, 7)
	require.NoError(t, err)
	var left []int64
	rows, err = e.schema.Pool.Query(ctx, `SELECT id FROM outbox ORDER BY id`)
	require.NoError(t, err)
	left, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	// The partitions wholly below the cursor, old and without a failure
	// went: the first two; the parked rows keep the third, a recent row
	// the fourth.
	require.Equal(t, ids[20:], left)
	require.Equal(t, 10, e.count("published_at IS NULL"), "pending and parked rows are never purged")
	var partitions []string
	rows, err = e.schema.Pool.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'outbox'::regclass ORDER BY 1`)
	require.NoError(t, err)
	partitions, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Contains(t, partitions, parkedPart, "a parked row keeps its partition")
	require.NotContains(t, partitions, "outbox_p0", "empty, below the cursor: dropped")
	var deleted int64
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT coalesce(sum(n_tup_del), 0) FROM pg_stat_user_tables
		WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'outbox'::regclass)`).Scan(&deleted))
	require.Zero(t, deleted, "no row deleted: partitions dropped whole")
	var receipts int
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_receipts`).Scan(&receipts))
	require.Equal(t, 3, receipts, "receipts older than the retention purged, in batches")

	// Once the parked row is discarded and published, its partition goes.
	_, err = e.schema.Pool.Exec(ctx, `DELETE FROM outbox_failures`)
	require.NoError(t, err)
	_, err = forwarder.Purge(ctx, e.schema.Pool, 15*24*time.Hour, 7)
	require.NoError(t, err)
	require.Equal(t, 20, e.count("true"), "the partition of the recent rows and those above the cursor stay")
	require.Zero(t, e.count(fmt.Sprintf("id = %d", ids[20])))
}

// Ids beyond the last partition (no forwarder created any for that long)
// land in outbox_default: the producers never fail. Those rows are purged
// row by row, and the next partition starts above them.
func TestIdsBeyondThePartitionsLandInTheDefault(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.schema.Pool.Exec(ctx, `SELECT setval('outbox_id_seq', 50000000)`)
	require.NoError(t, err)
	e.writeMany(aggregates(3), 1, 1)
	var inDefault int
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_default`).Scan(&inDefault))
	require.Equal(t, 3, inDefault)

	made, err := forwarder.EnsurePartitions(ctx, e.schema.Pool, 100)
	require.NoError(t, err)
	require.Equal(t, []string{"outbox_p50000004", "outbox_p50000104"}, made, "above the rows of the default partition")
	e.writeMany(aggregates(1), 1, 1)
	var part string
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM outbox ORDER BY id DESC LIMIT 1`).Scan(&part))
	require.Equal(t, "outbox_p50000004", part)

	_, err = e.schema.Pool.Exec(ctx, `
		UPDATE outbox SET created_at = now() - interval '20 days';
		INSERT INTO outbox_partitions (partition, published_through) SELECT 0, max(id) FROM outbox_default;
		INSERT INTO outbox_partition_sets (first_id, base, count) VALUES (0, 0, 1)`)
	require.NoError(t, err)
	_, err = forwarder.Purge(ctx, e.schema.Pool, 15*24*time.Hour, 2)
	require.NoError(t, err)
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_default`).Scan(&inDefault))
	require.Zero(t, inDefault, "deleted row by row, in batches")
	require.Equal(t, 1, e.count("true"), "the row above the cursor stays")
}

// The normal path writes nothing to a row after its INSERT: no mark, no
// row lock. Every row keeps the place the INSERT gave it (an UPDATE, HOT
// or not, would move it) and holds no locker's transaction id.
func TestPublishingWritesNothingToTheRows(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	e.writeMany(aggregates(20), 1, 10)
	place := func() map[int64]string {
		rows, err := e.schema.Pool.Query(ctx, `SELECT id, ctid::text || ' ' || xmax::text FROM outbox`)
		require.NoError(t, err)
		out := map[int64]string{}
		var (
			id int64
			p  string
		)
		_, err = pgx.ForEachRow(rows, []any{&id, &p}, func() error { out[id] = p; return nil })
		require.NoError(t, err)
		return out
	}
	before := place()
	for _, p := range before {
		require.True(t, strings.HasSuffix(p, " 0"), "a fresh row has no xmax: %s", p)
	}
	_, stop := e.run(e.config())
	outflowtest.WaitFor(t, 30*time.Second, "every row published", func() bool { return e.count("published_at IS NULL") == 0 })
	stop()
	requireInOrder(t, e.stream(), 200)
	require.Equal(t, before, place())
}

func TestTrimKeepsWhatAGroupHasNotAcknowledged(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	const total = 600
	e.writeMany(aggregates(60), 1, total/60)
	e.run(e.config())
	outflowtest.WaitFor(t, 20*time.Second, "forwarded", func() bool { return len(e.stream()) == total })

	n, err := e.broker.Trim(ctx, e.topic)
	require.NoError(t, err)
	require.Zero(t, n, "no group yet: nobody has read anything")

	// Group g acknowledged 450 entries and holds 50 pending; group h
	// acknowledged 300 and has not read the rest. The stream must keep
	// everything from h's first unread entry on.
	all, err := e.redis.XRange(ctx, e.topic, "-", "+").Result()
	require.NoError(t, err)
	ack := func(group string, read, acked int) {
		require.NoError(t, e.redis.XGroupCreate(ctx, e.topic, group, "0").Err())
		got, err := e.redis.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c", Streams: []string{e.topic, ">"}, Count: int64(read)}).Result()
		require.NoError(t, err)
		require.Len(t, got[0].Messages, read)
		ids := make([]string, acked)
		for i := range ids {
			ids[i] = got[0].Messages[i].ID
		}
		require.NoError(t, e.redis.XAck(ctx, e.topic, group, ids...).Err())
	}
	ack("g", 500, 450)
	ack("h", 300, 300)

	n, err = e.broker.Trim(ctx, e.topic)
	require.NoError(t, err)
	left, err := e.redis.XRange(ctx, e.topic, "-", "+").Result()
	require.NoError(t, err)
	t.Logf("trim removed %d of %d entries (approximate: whole nodes only)", n, total)
	require.Positive(t, n, "entries every group acknowledged are removed")
	require.Len(t, left, total-int(n), "the count trim reports is what left the stream")
	require.LessOrEqual(t, int(n), 300, "nothing h has not acknowledged is removed")
	require.Equal(t, all[total-len(left):], left, "what is left is the stream's tail, from an entry at or before h's first unread")

	// Once h catches up, g's oldest pending entry bounds the trim.
	ack2, err := e.redis.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "h", Consumer: "c", Streams: []string{e.topic, ">"}, Count: total}).Result()
	require.NoError(t, err)
	ids := make([]string, len(ack2[0].Messages))
	for i, m := range ack2[0].Messages {
		ids[i] = m.ID
	}
	require.NoError(t, e.redis.XAck(ctx, e.topic, "h", ids...).Err())
	n2, err := e.broker.Trim(ctx, e.topic)
	require.NoError(t, err)
	left, err = e.redis.XRange(ctx, e.topic, "-", "+").Result()
	require.NoError(t, err)
	t.Logf("second trim removed %d more", n2)
	require.Positive(t, n2)
	require.LessOrEqual(t, int(n+n2), 450, "g's pending entries (451-500) and unread ones are kept")
	require.Equal(t, all[total-len(left):], left)
}

// counter reads a counter's value from reg.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			var sum float64 // over its labels
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
	}
	return 0
}

// byLabel is name's values by the value of label.
func byLabel(t *testing.T, reg *prometheus.Registry, name, label string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					got[l.GetValue()] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
	}
	return got
}

// refusingBroker is the real broker, except that while refusing it refuses
// the listed messages for their own reason, as Kafka refuses a record over
// its size limit or NATS a message over a stream's: the rest of each
// Publish call goes to the real broker.
type refusingBroker struct {
	forwarder.Broker
	mu     sync.Mutex
	refuse map[string]bool // message id -> refused
	seen   map[string]int  // message id -> times offered
}

func (r *refusingBroker) setRefused(ids ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refuse = map[string]bool{}
	for _, id := range ids {
		r.refuse[id] = true
	}
}

func (r *refusingBroker) offered(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[id]
}

func (r *refusingBroker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	r.mu.Lock()
	if r.seen == nil {
		r.seen = map[string]int{}
	}
	errs := make([]error, len(msgs))
	var pass []forwarder.Outgoing
	var at []int
	for i, m := range msgs {
		r.seen[m.Message.UUID]++
		if r.refuse[m.Message.UUID] {
			errs[i] = fmt.Errorf("injected refusal of %s", m.Message.UUID)
			continue
		}
		pass = append(pass, m)
		at = append(at, i)
	}
	r.mu.Unlock()
	for j, err := range r.Broker.Publish(ctx, pass) {
		errs[at[j]] = err
	}
	return errs
}

// The broker refuses x v1 for its own reason and would accept x v2 in the
// same batch: v2 must not reach the stream, nor be marked, before v1; other
// aggregates flow meanwhile; when the refusal stops both arrive in order.
func TestRefusedRowHoldsItsAggregateInTheBatch(t *testing.T) {
	t.Parallel()
	e := setup(t)
	x1 := e.write("x", 1, testPayload{N: 1})
	x2 := e.write("x", 2, testPayload{N: 2})
	x3 := e.write("x", 3, testPayload{N: 3})
	others := aggregates(5)
	e.writeMany(others, 1, 3)
	rb := &refusingBroker{Broker: e.broker}
	rb.setRefused(x1)
	e.run(e.config(func(c *forwarder.Config) { c.Broker = rb; c.MaxAttempts = 1000 }))

	outflowtest.WaitFor(t, 20*time.Second, "x v1 refused and retried", func() bool {
		return rb.offered(x1) >= 3 && e.count("message_id = '"+x1+"' AND attempts >= 3") == 1
	})
	outflowtest.WaitFor(t, 20*time.Second, "the other aggregates forwarded", func() bool {
		return e.count("aggregate_id <> 'x' AND published_at IS NOT NULL") == 15
	})
	for _, en := range e.stream() {
		require.NotEqual(t, "x", en.aggregate, "x v%d reached the stream while v1 is refused", en.version)
	}
	require.Zero(t, rb.offered(x2), "x v2 was handed to the broker before v1 was acknowledged")
	require.Zero(t, rb.offered(x3))
	require.Equal(t, 3, e.count("aggregate_id = 'x' AND published_at IS NULL"), "no x row marked published")
	require.Zero(t, e.count("aggregate_id = 'x' AND id > (SELECT id FROM outbox WHERE message_id = '"+x1+"') AND attempts > 0"),
		"the held rows burnt no attempt")

	rb.setRefused()
	outflowtest.WaitFor(t, 20*time.Second, "x forwarded", func() bool { return e.count("published_at IS NULL") == 0 })
	requireInOrder(t, e.stream(), 18)
}

// failingBroker refuses every message with the error fail returns.
type failingBroker struct {
	mu    sync.Mutex
	calls int
	fail  func(forwarder.Outgoing) error
}

func (f *failingBroker) Publish(_ context.Context, msgs []forwarder.Outgoing) []error {
	f.mu.Lock()
	f.calls++
	f.mu.Unlock()
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		errs[i] = f.fail(m)
	}
	return errs
}

// A broker error whose text is cut inside a multi-byte character: the
// stored last_error must stay valid UTF-8, or PostgreSQL refuses the marks
// after every publish and the batch loops forever without an attempt
// counted.
func TestLongMultiByteErrorIsStoredAndCounted(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id := e.write("u", 1, testPayload{N: 1})
	fb := &failingBroker{fail: func(forwarder.Outgoing) error {
		return fmt.Errorf("%s: %s", strings.Repeat("x", 1997), strings.Repeat("é", 100)) // byte 2000 is inside an é
	}}
	e.run(e.config(func(c *forwarder.Config) { c.Broker = fb; c.MaxAttempts = 2 }))
	outflowtest.WaitFor(t, 10*time.Second, "the row parked after 2 attempts", func() bool {
		return e.count("parked_at IS NOT NULL AND attempts = 2") == 1
	})
	parked, err := forwarder.ListParked(context.Background(), e.schema.Pool, 1)
	require.NoError(t, err)
	require.Equal(t, id, parked[0].MessageID)
	require.Len(t, parked[0].LastError, 1999, "cut before the split character")
	require.True(t, strings.HasSuffix(parked[0].LastError, "x: "), "the split é dropped whole")
}

// gauge reads a gauge's value from reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// Two forwarders in one process export into one registry: the counters are
// process-wide sums, partitions_owned is the sum of both instances' leases.
func TestTwoForwardersInOneProcessShareMetrics(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := prometheus.NewRegistry()
	for i := range 2 {
		e.run(e.config(func(c *forwarder.Config) {
			c.InstanceID = "m-" + strconv.Itoa(i)
			c.Registerer = reg
			c.LeaseRenewInterval = 100 * time.Millisecond
		}))
	}
	owners := func() int {
		var n int
		require.NoError(t, e.schema.Pool.QueryRow(context.Background(),
			`SELECT count(DISTINCT owner) FROM outbox_partitions WHERE lease_until > now()`).Scan(&n))
		return n
	}
	outflowtest.WaitFor(t, 10*time.Second, "both instances lease partitions", func() bool {
		return owners() == 2 && e.countPartitionsOwned() == 16
	})
	outflowtest.WaitFor(t, 10*time.Second, "partitions_owned sums both instances", func() bool {
		return gauge(t, reg, "outflow_forwarder_partitions_owned") == 16
	})
	outflowtest.WaitFor(t, 10*time.Second, "partition_held is 1 for each of the 16 partitions", func() bool {
		held := byLabel(t, reg, "outflow_forwarder_partition_held", "partition")
		for p := range 16 {
			if held[strconv.Itoa(p)] != 1 {
				return false
			}
		}
		return len(held) == 16
	})

	e.writeMany(aggregates(40), 1, 2)
	outflowtest.WaitFor(t, 20*time.Second, "every row published", func() bool { return e.count("published_at IS NULL") == 0 })
	// published_total is recorded by each instance's lease loop, a tick
	// after the rows went out.
	outflowtest.WaitFor(t, 5*time.Second, "both instances forwarded rows", func() bool {
		var byOwner int
		require.NoError(t, e.schema.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM outbox_partitions WHERE published_total > 0`).Scan(&byOwner))
		return byOwner == 2
	})
	outflowtest.WaitFor(t, 5*time.Second, "forwarded_total counts both instances' rows", func() bool {
		return counter(t, reg, "outflow_forwarder_forwarded_total") == 80
	})
	require.Equal(t, map[string]float64{e.topic: 80}, byLabel(t, reg, "outflow_forwarder_forwarded_total", "topic"))
}

// A forwarder that runs without holding any lease (here: the only
// partition is someone else's) still blocks a repartition.
func TestRepartitionRefusesWhileAForwarderRunsWithoutLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, stopA := e.run(e.config(func(c *forwarder.Config) { c.InstanceID = "a"; c.Partitions = 1 }))
	outflowtest.WaitFor(t, 10*time.Second, "a leases the partition", func() bool { return e.countPartitionsOwned() == 1 })
	// b renews rarely: after its first tick it holds nothing until long
	// after the test.
	_, stopB := e.run(e.config(func(c *forwarder.Config) {
		c.InstanceID = "b"
		c.Partitions = 1
		c.TakeoverAfter = time.Hour
		c.LeaseRenewInterval = 30 * time.Minute
	}))
	outflowtest.WaitFor(t, 10*time.Second, "b's first lease tick done", func() bool {
		var n int
		require.NoError(t, e.schema.Pool.QueryRow(ctx,
			`SELECT count(*) FROM outbox_forwarders WHERE id = 'b' AND heartbeat_at > started_at`).Scan(&n))
		return n == 1
	})
	stopA()
	require.Zero(t, e.countPartitionsOwned(), "no partition is leased")

	err := forwarder.Repartition(ctx, e.schema.Pool, 4, 0)
	require.ErrorIs(t, err, forwarder.ErrForwardersRunning)
	require.ErrorContains(t, err, "b")
	require.ErrorContains(t, err, "stop every `outflow forward`")
	var n int
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_partitions`).Scan(&n))
	require.Equal(t, 1, n, "the partition count is unchanged")

	stopB()
	require.NoError(t, forwarder.Repartition(ctx, e.schema.Pool, 4, 0))
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_partitions`).Scan(&n))
	require.Equal(t, 4, n)
}

// blockingBroker holds a Publish call that carries the message block until
// release is closed, as a broker that stalls mid-batch.
type blockingBroker struct {
	forwarder.Broker
	block   atomic.Value // the message id (string) to hold
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

// holdFirst commits x v1 and waits until the broker holds it: a batch out
// until the test releases it.
func (b *blockingBroker) holdFirst(e *env) {
	e.t.Helper()
	ctx := context.Background()
	ev, err := events.New(ctx, events.Aggregate{Type: "test", ID: "x", Version: 1}, testPayload{N: 1})
	require.NoError(e.t, err)
	b.block.Store(ev.MessageID)
	require.NoError(e.t, pgx.BeginFunc(ctx, e.schema.Pool, func(tx pgx.Tx) error { return e.writer.PublishTx(ctx, tx, ev) }))
	select {
	case <-b.entered:
	case <-time.After(10 * time.Second):
		e.t.Fatal("a never published x v1")
	}
}

func (b *blockingBroker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	for _, m := range msgs {
		if id, _ := b.block.Load().(string); m.Message.UUID == id {
			b.once.Do(func() { close(b.entered) })
			select {
			case <-b.release:
			case <-ctx.Done():
			}
		}
	}
	return b.Broker.Publish(ctx, msgs)
}

// Instance a's batch stalls in the broker longer than its lease, and a
// cannot renew it (its lease loop is stuck; here on a lock the test holds on
// its heartbeat row); instance b waits for the expired partition. b must not
// take it, nor publish x v2, before a's transaction ends; then the stream
// has v1 before v2.
func TestLeaseExpiringDuringASlowBatchKeepsOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	lease := func(c *forwarder.Config) {
		c.Partitions = 1
		c.TakeoverAfter = time.Second
		c.LeaseRenewInterval = 100 * time.Millisecond
		c.PublishTimeout = 30 * time.Second
	}
	bb := &blockingBroker{Broker: e.broker, entered: make(chan struct{}), release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(bb.release) }) }
	t.Cleanup(release)
	e.run(e.config(lease, func(c *forwarder.Config) { c.InstanceID = "a"; c.Broker = bb }))
	outflowtest.WaitFor(t, 10*time.Second, "a leases the partition", func() bool { return e.countPartitionsOwned() == 1 })

	stuck, err := e.schema.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = stuck.Rollback(ctx) })
	_, err = stuck.Exec(ctx, `SELECT 1 FROM outbox_forwarders WHERE id = 'a' FOR UPDATE`)
	require.NoError(t, err)

	bb.holdFirst(e)
	// a can no longer renew: its lease ends at expiry.
	var expiry time.Time
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT lease_until FROM outbox_partitions`).Scan(&expiry))
	e.write("x", 2, testPayload{N: 2})
	e.run(e.config(lease, func(c *forwarder.Config) { c.InstanceID = "b" }))

	outflowtest.WaitFor(t, 10*time.Second, "b's lease ticks for 500ms after a's lease expired", func() bool {
		var n int
		require.NoError(t, e.schema.Pool.QueryRow(ctx, `
			SELECT count(*) FROM outbox_forwarders WHERE id = 'b' AND heartbeat_at > $1::timestamptz + interval '500 milliseconds'`,
			expiry).Scan(&n))
		return n == 1
	})
	var owner string
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT owner FROM outbox_partitions`).Scan(&owner))
	require.Equal(t, "a", owner, "b took a partition whose batch is in flight")
	require.Empty(t, e.stream(), "nothing published while a's batch is open")
	require.Equal(t, 2, e.count("published_at IS NULL"))

	release()
	require.NoError(t, stuck.Rollback(ctx))
	outflowtest.WaitFor(t, 20*time.Second, "both rows published", func() bool { return e.count("published_at IS NULL") == 0 })
	requireInOrder(t, e.stream(), 2)
}

// A claim fences its partitions without writing to their lease rows: a
// row lock (FOR SHARE, as the fence once was) is stored in the row, as its
// xmax, and costs a WAL record per partition and claim, about 870 B an
// event at a service's everyday rate of one event per claim. With no lease
// tick in the test's time, the lease rows are as the first tick left them.
func TestClaimsLeaveTheLeaseRowsUntouched(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	e.runWithoutTicks()
	var before []string
	// A row lock is written into the row version it locks: its xmax.
	versions := `SELECT array_agg(ctid::text || '/' || xmin::text || '/' || xmax::text ORDER BY partition) FROM outbox_partitions`
	require.NoError(t, e.schema.Pool.QueryRow(ctx, versions).Scan(&before))
	e.trickle(5)
	var after []string
	require.NoError(t, e.schema.Pool.QueryRow(ctx, versions).Scan(&after))
	require.Equal(t, before, after, "the lease rows changed or were locked by the claims")
}

// lateBroker answers its first call only once the call's context is done,
// as a broker acknowledging at PublishTimeout, and counts the later calls
// made with a context already done.
type lateBroker struct {
	forwarder.Broker
	calls, late atomic.Int32
}

func (b *lateBroker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	if b.calls.Add(1) == 1 {
		<-ctx.Done()
		return b.Broker.Publish(context.WithoutCancel(ctx), msgs)
	}
	if ctx.Err() != nil {
		b.late.Add(1)
	}
	return b.Broker.Publish(ctx, msgs)
}

// PublishTimeout bounds the whole batch, waves included: once the first
// wave used it up, the next wave (x v2) is not handed to the broker in that
// batch; it goes in a later one, after v1.
func TestPublishTimeoutSpansTheWaves(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.write("x", 1, testPayload{N: 1})
	e.write("x", 2, testPayload{N: 2})
	lb := &lateBroker{Broker: e.broker}
	e.run(e.config(func(c *forwarder.Config) { c.Broker = lb; c.PublishTimeout = 300 * time.Millisecond }))
	outflowtest.WaitFor(t, 10*time.Second, "both rows published", func() bool { return e.count("published_at IS NULL") == 0 })
	require.Zero(t, lb.late.Load(), "a wave was handed to the broker after the batch's PublishTimeout")
	require.Zero(t, e.count("attempts > 0"), "a timeout is the broker's, not the rows'")
	requireInOrder(t, e.stream(), 2)
}

// A forwarder silent for longer than Repartition's liveWithin counts as
// stopped, so the partition count can change under it. When it comes back
// it must not map rows with its old count (two instances would publish one
// aggregate's rows): it follows the database's, beside an instance started
// with the new one, and every aggregate's rows go out in order.
func TestForwarderFollowsARepartitionUnderIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	logs := &outflowtest.LogBuffer{}
	e.run(e.config(func(c *forwarder.Config) {
		c.InstanceID = "a"
		c.Partitions = 1
		c.TakeoverAfter = time.Second
		c.LeaseRenewInterval = 100 * time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(logs, t.Output()), &slog.HandlerOptions{Level: slog.LevelWarn}))
	}))
	outflowtest.WaitFor(t, 10*time.Second, "a leases the partition", func() bool { return e.countPartitionsOwned() == 1 })

	// a goes silent: its lease ticks wait on a lock the test holds on its
	// heartbeat row.
	stuck, err := e.schema.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = stuck.Rollback(ctx) })
	_, err = stuck.Exec(ctx, `SELECT 1 FROM outbox_forwarders WHERE id = 'a' FOR UPDATE`)
	require.NoError(t, err)
	outflowtest.WaitFor(t, 10*time.Second, "a counts as stopped and the repartition goes through", func() bool {
		err := forwarder.Repartition(ctx, e.schema.Pool, 4, time.Second)
		if errors.Is(err, forwarder.ErrForwardersRunning) {
			return false
		}
		require.NoError(t, err)
		return true
	})
	require.NoError(t, stuck.Rollback(ctx))

	e.run(e.config(func(c *forwarder.Config) {
		c.InstanceID = "b"
		c.Partitions = 4
		c.LeaseRenewInterval = 100 * time.Millisecond
	}))
	e.writeMany(aggregates(20), 1, 2)
	outflowtest.WaitFor(t, 20*time.Second, "b forwards every row", func() bool { return e.count("published_at IS NULL") == 0 })
	outflowtest.WaitFor(t, 20*time.Second, "a leases its share of the 4", func() bool {
		return e.countSQL(`SELECT count(*) FROM outbox_partitions WHERE owner = 'a'`) == 2
	})
	e.writeMany(aggregates(20), 1, 2)
	outflowtest.WaitFor(t, 20*time.Second, "every row forwarded", func() bool { return e.count("published_at IS NULL") == 0 })
	requireInOrder(t, e.stream(), 80)
	require.NotContains(t, logs.String(), "level=ERROR")
}

// Two lease ticks, each renewing its own instance's lease that ran out (a
// stall) and short of its share, each then wanting the other's partition:
// neither waits for the other's row, so they cannot deadlock (PostgreSQL
// would cancel one tick, its renewal with it, and hand its partition to the
// other for nothing). Each takes nothing: the other is renewing it.
func TestTakeoversOfEachOthersLeasesDoNotDeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO outbox_partitions (partition, owner, lease_until) VALUES (0, 'a', now() - interval '1 minute'), (1, 'b', now() - interval '1 minute');
		INSERT INTO outbox_partition_sets (first_id, base, count) VALUES (0, 0, 2)`)
	require.NoError(t, err)
	ticks := map[string]pgx.Tx{}
	for _, id := range []string{"a", "b"} {
		tx, err := s.Pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		_, err = tx.Exec(ctx, `UPDATE outbox_partitions SET lease_until = now() + interval '10 seconds' WHERE owner = $1`, id)
		require.NoError(t, err)
		ticks[id] = tx
	}
	took := make(chan error, 2)
	for _, id := range []string{"a", "b"} {
		go func() {
			rows, err := ticks[id].Query(ctx, forwarder.TakeoverSQL(), id, 10, 1, 0, 2)
			if err == nil {
				var got []int32
				got, err = pgx.CollectRows(rows, pgx.RowTo[int32])
				if err == nil && len(got) > 0 {
					err = fmt.Errorf("%s took %v, which the other tick is renewing", id, got)
				}
			}
			took <- err
		}()
	}
	for range 2 {
		select {
		case err := <-took:
			require.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Fatal("a takeover waits for the other tick's row")
		}
	}
}

// Repartition refuses while a forwarder runs, but one whose heartbeat
// stalled counts as stopped while its claims may go on: a batch of its
// still out is waited for (the fence) before the partitions change, or an
// aggregate's later rows could go out, under the new count, before it.
func TestRepartitionWaitsForABatchOut(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	bb := &blockingBroker{Broker: e.broker, entered: make(chan struct{}), release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(bb.release) }) }
	t.Cleanup(release)
	e.run(e.config(func(c *forwarder.Config) {
		c.InstanceID = "a"
		c.Partitions = 1
		c.TakeoverAfter = time.Hour
		c.LeaseRenewInterval = 100 * time.Millisecond
		c.PublishTimeout = time.Minute
		c.Broker = bb
	}))
	outflowtest.WaitFor(t, 10*time.Second, "a leases the partition", func() bool { return e.countPartitionsOwned() == 1 })
	bb.holdFirst(e)
	// a's heartbeat and lease stall (its lease loop waits on the test's
	// lock) and age past liveWithin: a counts as stopped. The ageing must
	// commit to be seen, and a lease tick of a's may slip in between it
	// and the lock that stalls the next one, renewing both: then again.
	var stuck pgx.Tx
	outflowtest.WaitFor(t, 10*time.Second, "a's heartbeat aged and its lease loop stalled", func() bool {
		_, err := e.schema.Pool.Exec(ctx, `UPDATE outbox_forwarders SET heartbeat_at = now() - interval '1 hour' WHERE id = 'a';
			UPDATE outbox_partitions SET lease_until = now() - interval '1 second'`)
		require.NoError(t, err)
		tx, err := e.schema.Pool.Begin(ctx)
		require.NoError(t, err)
		var aged bool
		require.NoError(t, tx.QueryRow(ctx, `SELECT heartbeat_at < now() - interval '30 minutes'
			AND NOT EXISTS (SELECT 1 FROM outbox_partitions WHERE lease_until > now())
			FROM outbox_forwarders WHERE id = 'a' FOR UPDATE`).Scan(&aged))
		if !aged {
			_ = tx.Rollback(ctx)
			return false
		}
		stuck = tx
		return true
	})
	t.Cleanup(func() { _ = stuck.Rollback(ctx) })

	// The repartition on a pool of its own: the forwarder's loops and the
	// test's transaction hold connections of the schema's pool.
	own, err := pgxpool.New(ctx, e.schema.URL)
	require.NoError(t, err)
	t.Cleanup(own.Close)
	done := make(chan error, 1)
	go func() { done <- forwarder.Repartition(ctx, own, 4, time.Second) }()
	// When the wait below times out, say what the repartition waits on
	// instead.
	waiting := false
	t.Cleanup(func() {
		if !t.Failed() || waiting {
			return
		}
		rows, err := e.schema.Pool.Query(ctx, `SELECT coalesce(wait_event_type, '') || ':' || coalesce(wait_event, '') || ' ' || left(query, 80)
			FROM pg_stat_activity WHERE datname = current_database() AND state <> 'idle' AND pid <> pg_backend_pid()`)
		if err == nil {
			if waits, err := pgx.CollectRows(rows, pgx.RowTo[string]); err == nil {
				t.Logf("the repartition is not waiting on the batch's fence; the sessions at work:\n%s", strings.Join(waits, "\n"))
			}
		}
	})
	outflowtest.WaitFor(t, 20*time.Second, "the repartition waiting on the batch's fence", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the repartition returned instead of waiting for the batch: %v", err)
		default:
		}
		// This schema's fence of partition 0 (fenceKey: the schema's hash
		// high, the partition low), asked for and not granted.
		waiting = e.countSQL(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
			AND classid::bigint = (hashtext(current_schema())::bigint & 4294967295) AND objid::bigint = 0`) > 0
		return waiting
	})
	select {
	case err := <-done:
		t.Fatalf("the repartition went through with a batch out: %v", err)
	default:
	}
	release()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the repartition never went through")
	}
	require.Equal(t, 4, e.countSQL(`SELECT count(*) FROM outbox_partitions`))
}
