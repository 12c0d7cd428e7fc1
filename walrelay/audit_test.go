package walrelay_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/walrelay"
)

// onStreams reads the orders topic's streams: each message id once, and
// the versions of each aggregate in the order the streams hold them
// (one stream: Partitions 1).
func onStreams(t *testing.T, c *redis.Client, b *redisstreams.Broker) (map[string]bool, map[string][]int) {
	t.Helper()
	seen, order := map[string]bool{}, map[string][]int{}
	for _, s := range b.Streams("orders") {
		msgs, err := c.XRange(context.Background(), s, "-", "+").Result()
		require.NoError(t, err)
		for _, m := range msgs {
			id, _ := m.Values["_watermill_message_uuid"].(string)
			if id == "" || seen[id] {
				continue
			}
			seen[id] = true
			md, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(m.Values)
			require.NoError(t, err)
			v, _ := strconv.Atoi(md.Metadata.Get(events.AggregateVersionKey))
			agg := md.Metadata.Get(events.AggregateIDKey)
			order[agg] = append(order[agg], v)
		}
	}
	return seen, order
}

// A broker that loses what it acknowledged, in WAL mode: the relay kept a
// receipt of each event (keyed by its history row) before it moved the
// slot past it, the audit finds them gone after the broker's data set was
// flushed, and the events go out again from the history, each aggregate's
// in order, held in outbox_wal_parked as a refusal's are. Without the
// receipts, nothing would tell the relay: the slot is long past them.
func TestAuditRepairsABrokerLossFromTheHistory(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := outflowtest.StartRedis(t)
	opts, err := redis.ParseURL(srv.URL)
	require.NoError(t, err)
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	b, err := redisstreams.New(redisstreams.Config{Client: c, Partitions: 1})
	require.NoError(t, err)
	r := e.run(e.config(func(cfg *walrelay.Config) {
		cfg.Broker = b
		cfg.AuditInterval = time.Hour // by hand, below
	}))

	for v := int64(1); v <= 3; v++ {
		for a := range 10 {
			e.write(e.event("agg-"+strconv.Itoa(a), v))
		}
	}
	outflowtest.WaitFor(t, 20*time.Second, "30 events on the stream", func() bool {
		seen, _ := onStreams(t, c, b)
		return len(seen) == 30
	})
	outflowtest.WaitFor(t, 20*time.Second, "their receipts", func() bool {
		return e.count(`SELECT coalesce(sum(cardinality(history_ids)), 0) FROM outbox_wal_receipts`) == 30
	})
	require.NoError(t, c.FlushAll(context.Background()).Err())

	require.NoError(t, r.Audit(context.Background()))
	var repaired int
	var reason string
	require.NoError(t, e.pg.Pool.QueryRow(context.Background(),
		`SELECT last_repaired, last_loss_reason FROM outbox_wal_audit WHERE broker_topic = $1`, b.Streams("orders")[0]).Scan(&repaired, &reason))
	require.Equal(t, 30, repaired)
	require.Contains(t, reason, "canary")
	require.Zero(t, e.count(`SELECT count(*) FROM outbox_wal_receipts`), "the lost receipts are forgotten once put back")

	outflowtest.WaitFor(t, 20*time.Second, "the 30 events on the stream again", func() bool {
		seen, _ := onStreams(t, c, b)
		return len(seen) == 30
	})
	_, order := onStreams(t, c, b)
	for agg, vs := range order {
		require.Equal(t, []int{1, 2, 3}, vs, "aggregate %s", agg)
	}
	outflowtest.WaitFor(t, 10*time.Second, "nothing left parked", func() bool {
		return e.count(`SELECT count(*) FROM outbox_wal_parked`) == 0
	})

	// What went out again has receipts again, and is found by the next
	// audit: no second loss.
	outflowtest.WaitFor(t, 20*time.Second, "the receipts of what went out again", func() bool {
		return e.count(`SELECT coalesce(sum(cardinality(history_ids)), 0) FROM outbox_wal_receipts`) == 30
	})
	require.NoError(t, r.Audit(context.Background()))
	require.Equal(t, 30, e.count(`SELECT last_repaired FROM outbox_wal_audit`))
	require.Equal(t, 30, e.count(`SELECT coalesce(sum(cardinality(history_ids)), 0) FROM outbox_wal_receipts`), "unsettled: no group reads them")
}
