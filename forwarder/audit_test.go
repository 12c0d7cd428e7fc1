package forwarder_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// ownRedis points e at a redis-server of the test's own, which it may
// flush: the shared one is never touched.
func (e *env) ownRedis(partitions int) *redis.Client {
	e.t.Helper()
	srv := outflowtest.StartRedis(e.t)
	opts, err := redis.ParseURL(srv.URL)
	require.NoError(e.t, err)
	c := redis.NewClient(opts)
	e.t.Cleanup(func() { c.Close() })
	e.redis = c
	b, err := redisstreams.New(redisstreams.Config{Client: c, Partitions: partitions})
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

func (e *env) lastMessageID() string {
	e.t.Helper()
	var id string
	require.NoError(e.t, e.schema.Pool.QueryRow(context.Background(), `SELECT message_id::text FROM outbox ORDER BY id DESC LIMIT 1`).Scan(&id))
	return id
}

func (e *env) audited() int {
	return e.countSQL(`SELECT count(*) FROM outbox_audit WHERE state IS NOT NULL`)
}

func (e *env) countSQL(q string) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.schema.Pool.QueryRow(context.Background(), q).Scan(&n))
	return n
}

// The audit takes a baseline, the broker loses everything (FLUSHALL), the
// next audit finds it and every row is published again through the normal
// path, once; the metrics and the state table record the repair. The
// forwarder's loop is kept out of the way (an hour's interval) and the
// audit called by hand, so the test knows when each audit ran; the
// low-water mark must be lowered by the repair (FullClaimInterval an hour:
// the safety net would hide it).
func TestAuditRepairsAFlushedStream(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.ownRedis(1)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	f, _ := e.run(e.config(func(cfg *forwarder.Config) {
		cfg.AuditInterval = time.Hour
		cfg.FullClaimInterval = time.Hour
		cfg.Registerer = reg
	}))
	e.writeMany(aggregates(10), 1, 5)
	outflowtest.WaitFor(t, 20*time.Second, "50 rows published", func() bool { return e.count("published_at IS NOT NULL") == 50 })
	e.passMark(f, e.lastMessageID())
	total := e.count("true")
	require.NoError(t, f.Audit(ctx))
	require.Equal(t, 1, e.audited(), "a baseline of the one stream")
	require.NoError(t, f.Audit(ctx))
	require.Zero(t, counter(t, reg, "outflow_forwarder_broker_losses_total"), "no loss while nothing was lost")

	require.NoError(t, c.FlushAll(ctx).Err())
	require.Zero(t, e.distinctOnStreams())
	require.NoError(t, f.Audit(ctx))
	outflowtest.WaitFor(t, 20*time.Second, "every row on the stream again, and marked", func() bool {
		return e.distinctOnStreams() == total && e.count("published_at IS NOT NULL") == total
	})
	requireInOrder(t, e.stream(), total)
	require.Equal(t, map[string]float64{e.topic: 1}, byLabel(t, reg, "outflow_forwarder_broker_losses_total", "topic"))
	require.Equal(t, map[string]float64{e.topic: float64(total)}, byLabel(t, reg, "outflow_forwarder_repaired_total", "topic"))
	var reason string
	var repaired int
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT last_loss_reason, last_repaired FROM outbox_audit WHERE broker_topic = $1`, e.topic).Scan(&reason, &repaired))
	require.Contains(t, reason, "canary missing")
	require.Equal(t, total, repaired)

	// The new baseline holds: the next audit finds nothing.
	require.NoError(t, f.Audit(ctx))
	require.Equal(t, 1.0, counter(t, reg, "outflow_forwarder_broker_losses_total"))
}

// A batch in flight when a loss is found: it published a row to the broker
// before the loss and has not committed the row's mark yet. The repair must
// wait for that mark, or its select would see the row pending, leave it
// alone, and the row would end published in the table and on no stream.
// The test plays the batch by hand (its partitions FOR SHARE, as a claim
// holds them, and the row's mark uncommitted; the row is parked so the
// forwarder itself leaves it alone).
func TestAuditRepairWaitsForABatchInFlight(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.ownRedis(1)
	ctx := context.Background()
	f, _ := e.run(e.config(func(cfg *forwarder.Config) {
		cfg.AuditInterval = time.Hour
		cfg.FullClaimInterval = time.Hour
	}))
	e.writeMany(aggregates(5), 1, 2)
	outflowtest.WaitFor(t, 20*time.Second, "10 rows published", func() bool { return e.count("published_at IS NOT NULL") == 10 })
	e.passMark(f, e.lastMessageID())
	require.NoError(t, f.Audit(ctx), "the baseline")

	var inFlight int64
	require.NoError(t, e.schema.Pool.QueryRow(ctx, `
		INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at,
		                    attempts, parked_at)
		VALUES (gen_random_uuid(), $1, 'test', 'in-flight', 1, 'test.happened', '{"n": 1}', now(), 1, now()) RETURNING id`,
		e.topic).Scan(&inFlight))
	batch, err := e.schema.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = batch.Rollback(ctx) }()
	var batchPID int
	require.NoError(t, batch.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&batchPID))
	_, err = batch.Exec(ctx, `SELECT 1 FROM outbox_partitions FOR SHARE`)
	require.NoError(t, err)
	_, err = batch.Exec(ctx, `UPDATE outbox SET published_at = now(), parked_at = NULL WHERE id = $1`, inFlight)
	require.NoError(t, err)

	total := e.count("true")
	require.NoError(t, c.FlushAll(ctx).Err())
	audit := make(chan error, 1)
	go func() { audit <- f.Audit(ctx) }()
	// The batch commits once the audit waits for it, or has finished
	// without waiting (what the test catches: then the row is lost).
	var (
		auditErr error
		finished bool
	)
	outflowtest.WaitFor(t, 20*time.Second, "the repair waiting for the batch in flight, or the audit finished", func() bool {
		select {
		case auditErr = <-audit:
			finished = true
			return true
		default:
		}
		var n int
		require.NoError(t, e.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE $1 = ANY(pg_blocking_pids(pid)) AND query LIKE '%outbox_partitions FOR UPDATE%'`, batchPID).Scan(&n))
		return n > 0
	})
	require.NoError(t, batch.Commit(ctx))
	if !finished {
		auditErr = <-audit
	}
	require.NoError(t, auditErr)
	outflowtest.WaitFor(t, 20*time.Second, "every row on the stream again, the one in flight too, and marked", func() bool {
		return e.distinctOnStreams() == total && e.count("published_at IS NOT NULL") == total
	})
}

// Recording the topics audited fails while outbox_audit_topics is missing
// (migrations not run): the forwarder goes on forwarding, and says so once
// an audit interval, not once a batch.
func TestTopicsNotRecordedWarnOnceAnInterval(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	_, err := e.schema.Pool.Exec(ctx, `DROP TABLE outbox_audit_topics`)
	require.NoError(t, err)
	var logs lockedBuffer
	e.run(e.config(func(cfg *forwarder.Config) {
		cfg.AuditInterval = time.Hour
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}))
	for i := range 5 {
		e.write("agg", int64(i+1), testPayload{N: i})
		outflowtest.WaitFor(t, 20*time.Second, "the row forwarded", func() bool { return e.count("published_at IS NOT NULL") == i+1 })
	}
	require.Equal(t, 1, strings.Count(logs.String(), "record topics for the broker audit"), "%s", logs.String())
}

// The loop itself: run by the holder of partition 0, every AuditInterval,
// over the topics the forwarder recorded. With two instances, each holding
// one partition, the repaired rows of the partition the auditor does not
// hold are claimed by the other instance, whose mark a watch on the
// repairs lowers (FullClaimInterval an hour: the safety net would hide a
// missing reset).
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
			cfg.FullClaimInterval = time.Hour
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
	outflowtest.WaitFor(t, 10*time.Second, "a baseline of both streams", func() bool { return e.audited() == 2 })
	require.Equal(t, 1, e.countSQL(`SELECT count(*) FROM outbox_audit_topics`))

	require.NoError(t, c.FlushAll(ctx).Err())
	outflowtest.WaitFor(t, 20*time.Second, "every row on the streams again", func() bool { return e.distinctOnStreams() == total })
	require.Equal(t, 2, e.countSQL(`SELECT count(*) FROM outbox_audit WHERE last_loss_at IS NOT NULL`))
}

// Trimming what every group acknowledged is not a loss: the audit runs
// between trims and reads, and never repairs.
func TestAuditIgnoresTrimming(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.ownRedis(1)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	f, _ := e.run(e.config(func(cfg *forwarder.Config) {
		cfg.AuditInterval = time.Hour
		cfg.Registerer = reg
	}))
	// Approximate trimming removes whole radix-tree nodes: small ones, so
	// that these few entries are trimmed.
	require.NoError(t, c.ConfigSet(ctx, "stream-node-max-entries", "4").Err())
	require.NoError(t, c.XGroupCreateMkStream(ctx, e.topic, "g", "0").Err())
	aggs := aggregates(5)
	for round := range 4 {
		e.writeMany(aggs, round*3+1, 3)
		want := (round + 1) * 15
		outflowtest.WaitFor(t, 20*time.Second, "rows published", func() bool { return e.count("published_at IS NOT NULL") == want })
		require.NoError(t, f.Audit(ctx))
		res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{e.topic, ">"}, Count: 1000}).Result()
		require.NoError(t, err)
		var ids []string
		for _, m := range res[0].Messages {
			ids = append(ids, m.ID)
		}
		require.NoError(t, f.Audit(ctx))
		require.NoError(t, c.XAck(ctx, e.topic, "g", ids...).Err())
		_, err = e.broker.TrimTopic(ctx, e.topic)
		require.NoError(t, err)
		require.NoError(t, f.Audit(ctx))
	}
	n, err := c.XLen(ctx, e.topic).Result()
	require.NoError(t, err)
	require.Less(t, n, int64(60), "trimming removed entries")
	require.Zero(t, counter(t, reg, "outflow_forwarder_broker_losses_total"))
	require.Zero(t, e.count("published_at IS NULL"))
}

// hangingAuditor is the real broker, except that the audit of one broker
// topic never answers (a NATS stream without a leader, a Redis node
// unreachable), until its context ends.
type hangingAuditor struct {
	*redisstreams.Broker
	hang string
}

func (h hangingAuditor) Audit(ctx context.Context, brokerTopic string, prev []byte) ([]byte, *forwarder.Loss, error) {
	if brokerTopic == h.hang {
		<-ctx.Done()
		return nil, nil, ctx.Err()
	}
	return h.Broker.Audit(ctx, brokerTopic, prev)
}

// A broker topic whose audit does not answer is that topic's error: the
// other broker topics' losses are still repaired and their states saved
// (an audit bounded as a whole used to roll all of them back).
func TestAuditRepairsDespiteABrokerTopicThatDoesNotAnswer(t *testing.T) {
	e := setup(t)
	c := e.ownRedis(2)
	ctx := context.Background()
	defer forwarder.SetAuditCallTimeout(forwarder.SetAuditCallTimeout(300 * time.Millisecond))
	streams := e.broker.Streams(e.topic)
	reg := prometheus.NewRegistry()
	f, _ := e.run(e.config(func(cfg *forwarder.Config) {
		cfg.Broker = hangingAuditor{Broker: e.broker, hang: streams[0]}
		cfg.AuditInterval = time.Hour
		cfg.Registerer = reg
	}))
	e.writeMany(aggregates(20), 1, 3)
	outflowtest.WaitFor(t, 20*time.Second, "60 rows published", func() bool { return e.count("published_at IS NOT NULL") == 60 })
	e.passMark(f, e.lastMessageID())
	require.Error(t, f.Audit(ctx), "the first stream's audit does not answer")
	require.Equal(t, 1, e.audited(), "a baseline of the second stream")

	require.NoError(t, c.FlushAll(ctx).Err())
	require.Error(t, f.Audit(ctx))
	require.Equal(t, 1.0, counter(t, reg, "outflow_forwarder_broker_losses_total"), "the second stream's loss found")
	require.Positive(t, counter(t, reg, "outflow_forwarder_repaired_total"))
	outflowtest.WaitFor(t, 20*time.Second, "the second stream's rows published again", func() bool {
		n, err := c.XLen(ctx, streams[1]).Result()
		return err == nil && n > 0
	})
}
