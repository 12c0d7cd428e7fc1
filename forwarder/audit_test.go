package forwarder_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// ownRedis points e at a redis-server of the test's own, which it may
// flush: the shared one is never touched.
func (e *env) ownRedis(partitions int) *redis.Client {
	e.t.Helper()
	srv := testservers.StartRedis(e.t)
	opts, err := redis.ParseURL(srv.URL)
	require.NoError(e.t, err)
	c := redis.NewClient(opts)
	e.t.Cleanup(func() { c.Close() })
	e.redis = c
	b, err := redisstreams.New(redisstreams.Config{Client: c, StreamPartitions: partitions})
	require.NoError(e.t, err)
	e.broker = b
	return c
}

// distinctOnStreams counts the distinct messages on the topic's streams.
func (e *env) distinctOnStreams() int {
	e.t.Helper()
	seen := map[string]bool{}
	for _, s := range e.broker.Streams(e.topic) {
		msgs, err := e.redis.XRange(context.Background(), s, "-", "+").Result()
		require.NoError(e.t, err)
		for _, m := range msgs {
			seen[m.Values["_watermill_message_uuid"].(string)] = true
		}
	}
	return len(seen)
}

func (e *env) countSQL(q string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.schema.Pool.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

// receipts counts the receipts not yet settled.
func (e *env) receipts() int {
	return e.countSQL(`SELECT coalesce(sum(cardinality(positions)), 0) FROM outbox_receipts`)
}

// readAck reads, as group g, every new entry of the topic's streams and
// acknowledges it: a consumer that had everything.
func (e *env) readAck(g string) {
	e.t.Helper()
	ctx := context.Background()
	for _, s := range e.broker.Streams(e.topic) {
		err := e.redis.XGroupCreateMkStream(ctx, s, g, "0").Err()
		if err != nil && err.Error() != "BUSYGROUP Consumer Group name already exists" {
			require.NoError(e.t, err)
		}
		res, err := e.redis.XReadGroup(ctx, &redis.XReadGroupArgs{Group: g, Consumer: "c", Streams: []string{s, ">"}, Count: 10000, Block: -1}).Result()
		if err == redis.Nil {
			continue
		}
		require.NoError(e.t, err)
		for _, m := range res[0].Messages {
			require.NoError(e.t, e.redis.XAck(ctx, s, g, m.ID).Err())
		}
	}
}

// A loss before any audit ran (issue 22, 1): rows forwarded, the broker
// flushed before the first audit, the forwarder restarted, more rows
// forwarded. The receipts in PostgreSQL show what the broker lost: every
// row of before the flush is published again, exactly those, once. The
// loop is kept out of the way (an hour's interval) and the audit called by
// hand; the repair puts the rows back in outbox_failures, below the
// cursor, where the claim reads them.
func TestAuditRepairsALossBeforeAnyAuditAcrossARestart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.ownRedis(1)
	ctx := context.Background()
	cfg := func(reg prometheus.Registerer) forwarder.Config {
		return e.config(func(cfg *forwarder.Config) {
			cfg.AuditInterval = time.Hour
			cfg.Registerer = reg
		})
	}
	f, stop := e.run(cfg(prometheus.NewRegistry()))
	e.writeMany(aggregates(10), 1, 5)
	outflowtest.WaitFor(t, 20*time.Second, "50 rows published", func() bool { return e.count("published_at IS NOT NULL") == 50 })
	// Past every row, not only the last of the 50 (passMark): a row above
	// the published_through stop() records would be published again by
	// the next forwarder, after the flush, and be one more on the streams.
	e.passAll(f)
	lost := e.count("true")
	require.NoError(t, c.FlushAll(ctx).Err())
	stop() // a host reboot takes the broker and the forwarder

	reg := prometheus.NewRegistry()
	f, _ = e.run(cfg(reg))
	e.writeMany(aggregates(10), 6, 2)
	outflowtest.WaitFor(t, 20*time.Second, "the rows after the restart published", func() bool { return e.count("published_at IS NOT NULL") == lost+20 })
	require.Equal(t, 20, e.distinctOnStreams())
	total := e.count("true")

	require.NoError(t, f.Audit(ctx))
	outflowtest.WaitFor(t, 20*time.Second, "every row on the stream again, and marked", func() bool {
		return e.distinctOnStreams() == total && e.count("published_at IS NOT NULL") == total
	})
	require.Equal(t, map[string]float64{e.topic: 1}, byLabel(t, reg, "outflow_forwarder_broker_losses_total", "topic"))
	require.Equal(t, map[string]float64{e.topic: float64(lost)}, byLabel(t, reg, "outflow_forwarder_repaired_total", "topic"),
		"exactly the rows of before the flush")
	var reason string
	var repaired int
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT last_loss_reason, last_repaired FROM outbox_audit WHERE broker_topic = $1`, e.topic).Scan(&reason, &repaired))
	require.Contains(t, reason, "canary")
	require.Equal(t, lost, repaired)

	// What was published again is checked again, and found.
	require.NoError(t, f.Audit(ctx))
	require.Equal(t, 1.0, counter(t, reg, "outflow_forwarder_broker_losses_total"))
}

// A repair costs what it repairs: what every consumer had is settled at
// an audit and never published again, whatever the broker loses later;
// only what some consumer had not is.
func TestAuditRepairsOnlyWhatConsumersLacked(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.ownRedis(1)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	f, _ := e.run(e.config(func(cfg *forwarder.Config) {
		cfg.AuditInterval = time.Hour
		cfg.Registerer = reg
	}))
	e.writeMany(aggregates(10), 1, 5)
	outflowtest.WaitFor(t, 20*time.Second, "50 rows published", func() bool { return e.count("published_at IS NOT NULL") == 50 })
	e.passMark(f, e.lastMessageID())
	e.readAck("g")
	require.NoError(t, f.Audit(ctx))
	require.Zero(t, e.receipts(), "every receipt settled")

	e.writeMany(aggregates(10), 6, 1)
	outflowtest.WaitFor(t, 20*time.Second, "10 more rows published", func() bool { return e.count("published_at IS NULL") == 0 && e.receipts() == 10 })
	require.NoError(t, c.FlushAll(ctx).Err())
	require.NoError(t, f.Audit(ctx))
	require.Equal(t, 10.0, counter(t, reg, "outflow_forwarder_repaired_total"))
	outflowtest.WaitFor(t, 20*time.Second, "the 10 rows on the stream again", func() bool { return e.distinctOnStreams() == 10 })
}

// A batch that published before a loss and committed its mark after the
// audit that found the loss: its receipts are committed with its mark, so
// the next audit checks them and finds them lost too. (No wait for the
// batches in flight is needed.) The batch is played by hand: a row marked
// published with a receipt of an entry the flush took.
func TestAuditChecksABatchThatCommittedAfterIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.ownRedis(1)
	ctx := context.Background()
	f, _ := e.run(e.config(func(cfg *forwarder.Config) {
		cfg.AuditInterval = time.Hour
	}))
	e.writeMany(aggregates(5), 1, 2)
	outflowtest.WaitFor(t, 20*time.Second, "10 rows published", func() bool { return e.count("published_at IS NOT NULL") == 10 })
	e.passMark(f, e.lastMessageID())
	require.NoError(t, f.Audit(ctx))

	// The late batch's row, parked (in outbox_failures) so that the
	// forwarder leaves it alone until its "mark" below, and its entry on
	// the stream.
	var late int64
	var msgID string
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `
		WITH r AS (
			INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
			VALUES (gen_random_uuid(), $1, 'test', 'late', 1, 'test.happened', '{"n": 1}', now()) RETURNING id, message_id),
		p AS (INSERT INTO outbox_failures (id, aggregate_type, aggregate_id, kind, attempts, parked_at)
			SELECT id, 'test', 'late', 'failed', 1, now() FROM r)
		SELECT id, message_id::text FROM r`, e.topic).Scan(&late, &msgID))
	e.flow(2) // the cursor moves past it: the row is published once it leaves outbox_failures
	pos, err := c.XAdd(ctx, &redis.XAddArgs{Stream: e.topic, Values: map[string]any{"_watermill_message_uuid": msgID}}).Result()
	require.NoError(t, err)

	total := e.count("true")
	require.NoError(t, c.FlushAll(ctx).Err())
	require.NoError(t, f.Audit(ctx), "finds the loss of the batches committed so far")
	_, err = e.schema.Pool.Exec(ctx, `
		WITH m AS (DELETE FROM outbox_failures WHERE id = $1)
		INSERT INTO outbox_receipts (outbox_ids, broker_topics, positions) VALUES (ARRAY[$1::bigint], ARRAY[$2], ARRAY[$3])`,
		late, e.topic, pos)
	require.NoError(t, err)
	require.NoError(t, f.Audit(ctx), "finds the late batch's loss")
	outflowtest.WaitFor(t, 20*time.Second, "every row on the stream again, the late one too, and marked", func() bool {
		return e.distinctOnStreams() == total && e.count("published_at IS NOT NULL") == total
	})
}

// The loop itself: run by the holder of partition 0, every AuditInterval.
// With two instances, each holding one partition, the repaired rows of the
// partition the auditor does not hold are claimed by the other instance,
// from outbox_failures.
func TestAuditLoopRepairsEveryPartition(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.ownRedis(2)
	ctx := context.Background()
	cfg := func(id string) forwarder.Config {
		return e.config(func(cfg *forwarder.Config) {
			cfg.InstanceID = id
			cfg.Partitions = 2
			cfg.AuditInterval = 50 * time.Millisecond
		})
	}
	a, _ := e.run(cfg("a"))
	b, _ := e.run(cfg("b"))
	outflowtest.WaitFor(t, 20*time.Second, "one partition each", func() bool {
		return e.countSQL(`SELECT count(DISTINCT owner) FROM outbox_partitions WHERE lease_until > now()`) == 2
	})
	e.writeMany(aggregates(20), 1, 3)
	outflowtest.WaitFor(t, 20*time.Second, "60 rows published", func() bool { return e.count("published_at IS NOT NULL") == 60 })
	last := e.lastMessageID()
	e.passMark(a, last)
	e.passMark(b, last)
	total := e.count("true")

	require.NoError(t, c.FlushAll(ctx).Err())
	outflowtest.WaitFor(t, 20*time.Second, "every row on the streams again", func() bool { return e.distinctOnStreams() == total })
	require.Equal(t, 2, e.countSQL(`SELECT count(*) FROM outbox_audit WHERE last_loss_at IS NOT NULL`))
}

// The audit trims what it settled, and its trims are never losses: rounds
// of writes, a group that reads and acknowledges, and audits between.
func TestAuditTrimsAndNeverTakesItsTrimForALoss(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.ownRedis(1)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	f, _ := e.run(e.config(func(cfg *forwarder.Config) {
		cfg.AuditInterval = time.Hour
		cfg.Registerer = reg
	}))
	aggs := aggregates(5)
	for round := range 4 {
		e.writeMany(aggs, round*3+1, 3)
		want := (round + 1) * 15
		outflowtest.WaitFor(t, 20*time.Second, "rows published", func() bool { return e.count("published_at IS NOT NULL") == want })
		require.NoError(t, f.Audit(ctx))
		e.readAck("g")
		require.NoError(t, f.Audit(ctx))
	}
	require.Zero(t, e.receipts(), "every receipt settled")
	require.NoError(t, f.Audit(ctx)) // applies the trim the last one decided
	n, err := c.XLen(ctx, e.topic).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the audit trimmed what it settled")
	require.Zero(t, counter(t, reg, "outflow_forwarder_broker_losses_total"))
	require.Zero(t, e.count("published_at IS NULL"))
}

// The purge must not delete rows a repair puts back (issue 22, 3). Rows
// published longer ago than the retention, their receipts not settled
// (no consumer read them), the broker flushed; the audit's repair puts
// them back and, before it commits, the purge's DELETE reaches them and
// waits for their locks. After the repair commits, the DELETE must see
// them pending and keep them: filtered on its scan's copy of published_at,
// it deleted them, lost. The audit is held before its commit by a lock the
// test takes on its state row.
func TestPurgeKeepsRowsARepairPutBack(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.ownRedis(1)
	ctx := context.Background()
	f, _ := e.run(e.config(func(cfg *forwarder.Config) {
		cfg.AuditInterval = time.Hour
	}))
	e.writeMany(aggregates(3), 1, 1)
	outflowtest.WaitFor(t, 20*time.Second, "3 rows published", func() bool { return e.count("published_at IS NOT NULL") == 3 })
	require.NoError(t, f.Audit(ctx)) // the audit's state row exists
	_, err := e.schema.Pool.Exec(ctx, `UPDATE outbox SET created_at = now() - interval '20 days'`)
	require.NoError(t, err)
	require.NoError(t, c.FlushAll(ctx).Err())

	hold, err := e.schema.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(ctx) }()
	_, err = hold.Exec(ctx, `SELECT 1 FROM outbox_audit FOR UPDATE`)
	require.NoError(t, err)
	audit := make(chan error, 1)
	go func() { audit <- f.Audit(ctx) }()
	outflowtest.WaitFor(t, 20*time.Second, "the audit to have put the rows back and wait to save its state", func() bool {
		return e.waiting(`%INSERT INTO outbox_audit%`)
	})
	purge := make(chan error, 1)
	go func() {
		_, err := forwarder.Purge(ctx, e.schema.Pool, 15*24*time.Hour, 100)
		purge <- err
	}()
	outflowtest.WaitFor(t, 20*time.Second, "the purge to wait for the repair", func() bool {
		return e.waiting(`%LOCK TABLE outbox_failures%`)
	})
	require.NoError(t, hold.Rollback(ctx))
	require.NoError(t, <-audit)
	require.NoError(t, <-purge)
	require.Equal(t, 3, e.count("true"), "the purge kept the rows put back")
	outflowtest.WaitFor(t, 20*time.Second, "the rows on the stream again", func() bool { return e.distinctOnStreams() == 3 })
}

// waiting reports whether a statement like pattern waits for a lock.
func (e *env) waiting(pattern string) bool {
	return e.countSQL(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`, pattern) > 0
}

// checkingBroker is the real broker, except that the Check of one broker
// topic never answers (a NATS stream without a leader, a Redis node
// unreachable), until its context ends.
type checkingBroker struct {
	*redisstreams.Broker
	hang string
}

func (h checkingBroker) Check(ctx context.Context, brokerTopic string, prev []byte, held []forwarder.Held, partial bool) (forwarder.Verdict, error) {
	if brokerTopic == h.hang {
		<-ctx.Done()
		return forwarder.Verdict{}, ctx.Err()
	}
	return h.Broker.Check(ctx, brokerTopic, prev, held, partial)
}

// reasonlessBroker is the real broker, except that its verdicts give no
// reason for their losses.
type reasonlessBroker struct{ *redisstreams.Broker }

func (r reasonlessBroker) Check(ctx context.Context, brokerTopic string, prev []byte, held []forwarder.Held, partial bool) (forwarder.Verdict, error) {
	v, err := r.Broker.Check(ctx, brokerTopic, prev, held, partial)
	v.Reason = ""
	return v, err
}

// A loss whose verdict gives no reason is a loss all the same: recorded in
// outbox_audit (so that every instance lowers its mark), with a reason
// saying there was none.
func TestAuditRecordsALossWithoutAReason(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.ownRedis(1)
	ctx := context.Background()
	f, _ := e.run(e.config(func(cfg *forwarder.Config) {
		cfg.Broker = reasonlessBroker{e.broker}
		cfg.AuditInterval = time.Hour
	}))
	e.writeMany(aggregates(3), 1, 1)
	outflowtest.WaitFor(t, 20*time.Second, "3 rows published", func() bool { return e.count("published_at IS NOT NULL") == 3 })
	require.NoError(t, c.FlushAll(ctx).Err())
	require.NoError(t, f.Audit(ctx))
	var reason string
	var from *int64
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT last_loss_reason, repair_from_id FROM outbox_audit WHERE last_loss_at IS NOT NULL`).Scan(&reason, &from))
	require.Contains(t, reason, "no reason")
	require.NotNil(t, from)
}

// A broker topic whose Check does not answer is that topic's error: the
// other broker topics' losses are still repaired, and its receipts are
// kept for the next audit, which repairs them once it answers.
func TestAuditRepairsDespiteABrokerTopicThatDoesNotAnswer(t *testing.T) {
	e := setup(t)
	c := e.ownRedis(2)
	ctx := context.Background()
	defer forwarder.SetAuditCallTimeout(forwarder.SetAuditCallTimeout(300 * time.Millisecond))
	streams := e.broker.Streams(e.topic)
	reg := prometheus.NewRegistry()
	broker := &checkingBroker{Broker: e.broker, hang: streams[0]}
	f, _ := e.run(e.config(func(cfg *forwarder.Config) {
		cfg.Broker = broker
		cfg.AuditInterval = time.Hour
		cfg.Registerer = reg
	}))
	e.writeMany(aggregates(20), 1, 3)
	outflowtest.WaitFor(t, 20*time.Second, "60 rows published", func() bool { return e.count("published_at IS NOT NULL") == 60 })
	require.NoError(t, c.FlushAll(ctx).Err())
	require.Error(t, f.Audit(ctx), "the first stream's Check does not answer")
	require.Equal(t, 1.0, counter(t, reg, "outflow_forwarder_broker_losses_total"), "the second stream's loss found")
	outflowtest.WaitFor(t, 20*time.Second, "the second stream's rows published again", func() bool {
		n, err := c.XLen(ctx, streams[1]).Result()
		return err == nil && n > 0
	})
	n, err := c.XLen(ctx, streams[0]).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the first stream's rows wait for its Check")

	broker.hang = ""
	require.NoError(t, f.Audit(ctx))
	require.Equal(t, 2.0, counter(t, reg, "outflow_forwarder_broker_losses_total"))
	outflowtest.WaitFor(t, 20*time.Second, "every row on the streams again", func() bool { return e.distinctOnStreams() == 60 })
}

func (e *env) lastMessageID() string {
	e.t.Helper()
	var id string
	require.NoError(e.t, e.schema.Pool.QueryRow(context.Background(), `SELECT message_id::text FROM outbox ORDER BY id DESC LIMIT 1`).Scan(&id))
	return id
}

// stallingAuditor is the real broker, except that a publish carrying the
// message block is held until release is closed: a batch stalled in the
// broker, its claim's locks held.
type stallingAuditor struct {
	*redisstreams.Broker
	block   atomic.Value // the message id (string) to hold
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (s *stallingAuditor) PublishReceipts(ctx context.Context, msgs []forwarder.Outgoing) ([]forwarder.Receipt, []error) {
	for _, m := range msgs {
		if id, _ := s.block.Load().(string); m.Message.UUID == id {
			s.once.Do(func() { close(s.entered) })
			select {
			case <-s.release:
			case <-ctx.Done():
			}
		}
	}
	return s.Broker.PublishReceipts(ctx, msgs)
}

// A repair holds no other forwarder (issue 22): while one instance's batch
// is stalled in the broker, an audit finds a loss and repairs it, and the
// other instance goes on forwarding its own rows meanwhile. (A repair used
// to wait for the batches in flight by locking every partition FOR UPDATE:
// the other instance's claims queued behind it for as long as the stalled
// batch lasted, up to 30 s.)
func TestARepairHoldsNoOtherForwarder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.ownRedis(1)
	ctx := context.Background()
	brokers := map[string]*stallingAuditor{}
	forwarders := map[string]*forwarder.Forwarder{}
	for _, id := range []string{"a", "b"} {
		brokers[id] = &stallingAuditor{Broker: e.broker, entered: make(chan struct{}), release: make(chan struct{})}
		forwarders[id], _ = e.run(e.config(func(cfg *forwarder.Config) {
			cfg.InstanceID = id
			cfg.Partitions = 2
			cfg.Broker = brokers[id]
			cfg.AuditInterval = time.Hour
			cfg.PublishTimeout = time.Minute
		}))
	}
	outflowtest.WaitFor(t, 20*time.Second, "one partition each", func() bool {
		return e.countSQL(`SELECT count(DISTINCT owner) FROM outbox_partitions WHERE lease_until > now()`) == 2
	})
	// The stalled instance holds partition 1: a lock of every partition in
	// order takes 0, the other's, before it waits for 1.
	var stalled, free string
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT owner FROM outbox_partitions WHERE partition = 1`).Scan(&stalled))
	free = map[string]string{"a": "b", "b": "a"}[stalled]
	aggIn := func(partition int) string {
		for i := 0; ; i++ {
			agg := fmt.Sprint("agg-", i)
			if e.countSQL(`SELECT (((hashtextextended($1, 0) % 2) + 2) % 2)::int`, agg) == partition {
				return agg
			}
		}
	}
	e.writeMany(aggregates(10), 1, 2)
	outflowtest.WaitFor(t, 20*time.Second, "20 rows published", func() bool { return e.count("published_at IS NOT NULL") == 20 })
	require.NoError(t, c.FlushAll(ctx).Err())

	brokers[stalled].block.Store(e.write(aggIn(1), 1, testPayload{N: 1}))
	<-brokers[stalled].entered
	defer close(brokers[stalled].release)
	audit := make(chan error, 1)
	go func() { audit <- forwarders[free].Audit(ctx) }()
	require.NoError(t, <-audit, "the audit and its repair do not wait for the stalled batch")
	e.write(aggIn(0), 1, testPayload{N: 2})
	outflowtest.WaitFor(t, 20*time.Second, "the free instance to forward its rows, the repaired ones and a new one", func() bool {
		return e.countSQL(`SELECT count(*) FROM outbox o JOIN outbox_state s USING (id)
			WHERE NOT s.published AND (((hashtextextended(o.aggregate_id, 0) % 2) + 2) % 2) = 0`) == 0
	})
}

// One audit reads a bounded number of receipts: the oldest and the
// newest rows. While it leaves some between them unread, Check is told so
// (partial) and trims nothing, since it cannot know what it was not shown;
// the receipts left are settled by the audits after, and the stream
// trimmed once one audit sees them all. Not parallel: it sets the bounds
// every audit of the package reads.
func TestAuditBoundedByReceiptsTrimsNothingItWasNotShown(t *testing.T) {
	defer forwarder.SetAuditLimits(5, 1000)()
	e := setup(t)
	c := e.ownRedis(1)
	ctx := context.Background()
	f, _ := e.run(e.config(func(cfg *forwarder.Config) {
		cfg.AuditInterval = time.Hour
		cfg.BatchSize = 1 // a receipt row per row
	}))
	// One row at a time: a batch of one may also carry the late row of a
	// transaction that committed meanwhile, two rows in one receipt.
	for i := range 30 {
		e.write(fmt.Sprint("agg-", i), 1, testPayload{N: i})
		outflowtest.WaitFor(t, 20*time.Second, "the row published", func() bool {
			return e.countSQL(`SELECT count(*) FROM outbox_receipts`) == i+1
		})
	}
	require.Equal(t, 30, e.countSQL(`SELECT count(*) FROM outbox_receipts`))
	e.readAck("g")

	require.NoError(t, f.Audit(ctx))
	require.Equal(t, 20, e.receipts(), "the oldest 5 and the newest 5 settled")
	require.NoError(t, f.Audit(ctx))
	require.Equal(t, 10, e.receipts())
	n, err := c.XLen(ctx, e.topic).Result()
	require.NoError(t, err)
	require.EqualValues(t, 30, n, "nothing trimmed while receipts were left unread")
	// The audit that sees the last 10 receipts, all of them, decides a
	// trim below the newest of them, and the next applies it (the entries
	// settled above them, by the partial audits, go with a later trim).
	require.NoError(t, f.Audit(ctx))
	require.Zero(t, e.receipts())
	require.NoError(t, f.Audit(ctx))
	n, err = c.XLen(ctx, e.topic).Result()
	require.NoError(t, err)
	require.EqualValues(t, 10, n, "trimmed below what the last audit was shown")
}

// runWithoutTicks runs a forwarder, audited by hand, to a Redis of the
// test's own, whose lease loop ticks once (the partitions leased) and not
// again in the test's time; it returns the function that stops it.
func (e *env) runWithoutTicks() func() {
	e.t.Helper()
	e.ownRedis(1)
	_, stop := e.run(e.config(func(c *forwarder.Config) {
		c.AuditInterval = time.Hour
		c.LeaseRenewInterval = time.Hour
		c.TakeoverAfter = 2 * time.Hour
	}))
	outflowtest.WaitFor(e.t, 10*time.Second, "the partitions leased", func() bool { return e.countPartitionsOwned() == 16 })
	return stop
}

// trickle writes n events of one aggregate, each once the previous is on
// the stream: a batch each.
func (e *env) trickle(n int) {
	e.t.Helper()
	for v := range n {
		e.write("x", int64(v+1), testPayload{N: v})
		outflowtest.WaitFor(e.t, 10*time.Second, "the row on the stream", func() bool { return e.distinctOnStreams() == v+1 })
	}
}

// At a service's everyday rate each batch carries one event; its receipt
// waits in memory for the lease tick that records the cursor past it, and
// every batch since the last tick goes in one row: a row per batch cost
// about 500 B of WAL an event, more than the rest of the relay. Here no
// lease tick comes after the first: the receipts are written when the
// forwarder stops, in one row.
func TestReceiptsOfATrickleGoInOneRowPerTick(t *testing.T) {
	t.Parallel()
	e := setup(t)
	stop := e.runWithoutTicks()
	e.trickle(5)
	require.Zero(t, e.countSQL(`SELECT count(*) FROM outbox_receipts`), "receipts written before a lease tick")
	stop()
	require.Equal(t, 1, e.countSQL(`SELECT count(*) FROM outbox_receipts`), "one row for the five batches")
	require.Equal(t, 5, e.receipts())
}

// Whenever the recorded cursor has passed a row (a crash then no longer
// publishes it again), its receipt is in outbox_receipts: the lease tick
// writes the receipts of the batches it records. The audit is not run and
// the forwarder not stopped.
func TestReceiptsAreRecordedWithTheCursor(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.ownRedis(1)
	e.run(e.config(func(c *forwarder.Config) {
		c.AuditInterval = time.Hour
		c.LeaseRenewInterval = 100 * time.Millisecond
	}))
	e.writeMany(aggregates(10), 1, 2)
	outflowtest.WaitFor(t, 20*time.Second, "the recorded cursor past every row", func() bool {
		return e.count("published_at IS NULL") == 0 &&
			e.countSQL(`SELECT count(*) FROM outbox o WHERE NOT EXISTS (
				SELECT 1 FROM outbox_partitions p WHERE p.partition = outbox_partition_of(o.id, o.aggregate_id) AND p.published_through >= o.id)`) == 0
	})
	require.Equal(t, 20, e.countSQL(`SELECT count(DISTINCT x) FROM outbox_receipts, unnest(outbox_ids) x`), "rows whose receipt is not written")
}

// With more receipts waiting for a lease tick than maxPendingReceipts (a
// lease loop stuck while claims go on), a batch writes its own receipts
// with it rather than let memory grow: here the bound is 2, no lease tick
// comes after the first, and of 4 batches the last 2 write theirs.
func TestReceiptsPastTheBoundAreWrittenWithTheirBatch(t *testing.T) {
	defer forwarder.SetMaxPendingReceipts(2)()
	e := setup(t)
	stop := e.runWithoutTicks()
	e.trickle(4)
	// A batch's receipts commit with its marks, after the broker took it:
	// wait for the last batch's commit, not only for its row on the stream.
	outflowtest.WaitFor(t, 10*time.Second, "the batches past the bound wrote their receipts", func() bool { return e.receipts() == 2 })
	stop()
	require.Equal(t, 4, e.receipts())
}
