package walrelay_test

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
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
	c, b := ownRedis(t)
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

	// The relay puts the repaired events out again as soon as the audit
	// parks them, with receipts of their own: only the receipts written
	// before the audit must be gone.
	lost := e.count(`SELECT coalesce(max(id), 0) FROM outbox_wal_receipts`)
	require.NoError(t, r.Audit(context.Background()))
	var repaired int
	var reason string
	require.NoError(t, e.pg.Pool.QueryRow(context.Background(),
		`SELECT last_repaired, last_loss_reason FROM outbox_wal_audit WHERE broker_topic = $1`, b.Streams("orders")[0]).Scan(&repaired, &reason))
	require.Equal(t, 30, repaired)
	require.Contains(t, reason, "canary")
	require.Zero(t, e.count(`SELECT count(*) FROM outbox_wal_receipts WHERE id <= `+strconv.Itoa(lost)), "the lost receipts are forgotten once put back")

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

// ownRedis is a redis-server of the test's own, which it may flush, and a
// broker of one stream per topic on it.
func ownRedis(t *testing.T) (*redis.Client, *redisstreams.Broker) {
	t.Helper()
	srv := testservers.StartRedis(t)
	opts, err := redis.ParseURL(srv.URL)
	require.NoError(t, err)
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	b, err := redisstreams.New(redisstreams.Config{Client: c, StreamPartitions: 1})
	require.NoError(t, err)
	return c, b
}

// refusing is a Redis broker that refuses the message ids in refuse, for
// their own reason.
type refusing struct {
	*redisstreams.Broker
	mu     sync.Mutex
	refuse map[string]bool
}

func (b *refusing) set(ids ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refuse = map[string]bool{}
	for _, id := range ids {
		b.refuse[id] = true
	}
}

func (b *refusing) PublishReceipts(ctx context.Context, msgs []forwarder.Outgoing) ([]forwarder.Receipt, []error) {
	b.mu.Lock()
	refused := maps.Clone(b.refuse)
	b.mu.Unlock()
	receipts, errs := make([]forwarder.Receipt, len(msgs)), make([]error, len(msgs))
	var pass []forwarder.Outgoing
	var at []int
	for i, m := range msgs {
		if refused[m.Message.UUID] {
			errs[i] = fmt.Errorf("injected refusal of %s", m.Message.UUID)
			continue
		}
		pass = append(pass, m)
		at = append(at, i)
	}
	if len(pass) > 0 {
		rs, es := b.Broker.PublishReceipts(ctx, pass)
		for j, i := range at {
			receipts[i], errs[i] = rs[j], es[j]
		}
	}
	return receipts, errs
}

// refusingRelay is a relay auditing (by hand) a Redis of the test's own
// through a broker that refuses what it is told to, parking a refused
// event for an operator at once (MaxAttempts 1).
func refusingRelay(t *testing.T) (*env, *redis.Client, *redisstreams.Broker, *refusing, *walrelay.Relay) {
	t.Helper()
	e := setup(t)
	c, rb := ownRedis(t)
	b := &refusing{Broker: rb}
	r := e.run(e.config(func(cfg *walrelay.Config) {
		cfg.Broker = b
		cfg.AuditInterval = time.Hour
		cfg.MaxAttempts = 1
	}))
	return e, c, rb, b, r
}

func (e *env) waitParkedForOperator(messageID string) {
	e.t.Helper()
	outflowtest.WaitFor(e.t, 20*time.Second, "the event parked for an operator", func() bool {
		return e.count(`SELECT count(*) FROM outbox_wal_parked WHERE message_id = $1 AND parked_at IS NOT NULL`, messageID) == 1
	})
}

// A lost event is repaired into outbox_wal_parked after its aggregate's
// later event was parked there (refused, then left for an operator): it
// goes out first, by its place in the WAL, not behind the later one; and
// the later one, retried, goes out after it.
func TestRepairedEventGoesBeforeItsAggregatesLaterParkedOne(t *testing.T) {
	t.Parallel()
	e, c, rb, b, r := refusingRelay(t)
	a1, a2 := e.event("a", 1), e.event("a", 2)
	e.write(a1)
	outflowtest.WaitFor(t, 20*time.Second, "a1's receipt", func() bool {
		return e.count(`SELECT coalesce(sum(cardinality(history_ids)), 0) FROM outbox_wal_receipts`) == 1
	})
	b.set(a2.MessageID)
	e.write(a2)
	e.waitParkedForOperator(a2.MessageID)
	b.set()
	require.NoError(t, c.FlushAll(context.Background()).Err())
	require.NoError(t, r.Audit(context.Background()))
	outflowtest.WaitFor(t, 20*time.Second, "a1 on the stream again", func() bool {
		seen, _ := onStreams(t, c, rb)
		return seen[a1.MessageID]
	})
	n, err := walrelay.RetryParked(context.Background(), e.pg.Pool, walrelay.ParkedFilter{})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	outflowtest.WaitFor(t, 20*time.Second, "a2 on the stream", func() bool {
		seen, _ := onStreams(t, c, rb)
		return seen[a2.MessageID]
	})
	_, order := onStreams(t, c, rb)
	require.Equal(t, []int{1, 2}, order["a"])
}

// A discard marker the broker lost goes out again as the marker, not as
// the event it stands for: it had a receipt like any event, and the
// history row says the event was discarded.
func TestLostDiscardMarkerIsRepairedAsTheMarker(t *testing.T) {
	t.Parallel()
	e, c, rb, b, r := refusingRelay(t)
	a1, a2 := e.event("a", 1), e.event("a", 2)
	b.set(a2.MessageID)
	e.write(a1)
	e.write(a2)
	e.waitParkedForOperator(a2.MessageID)
	b.set()
	_, err := walrelay.DiscardParked(context.Background(), e.pg.Pool, walrelay.ParkedFilter{})
	require.NoError(t, err)
	outflowtest.WaitFor(t, 20*time.Second, "the receipts of a1 and of a2's marker", func() bool {
		return e.count(`SELECT coalesce(sum(cardinality(history_ids)), 0) FROM outbox_wal_receipts`) == 2 &&
			e.count(`SELECT count(*) FROM outbox_wal_parked`) == 0
	})
	require.NoError(t, c.FlushAll(context.Background()).Err())
	require.NoError(t, r.Audit(context.Background()))
	outflowtest.WaitFor(t, 20*time.Second, "both on the stream again", func() bool {
		seen, _ := onStreams(t, c, rb)
		return len(seen) == 2
	})
	var types []string
	msgs, err := c.XRange(context.Background(), rb.Streams("orders")[0], "-", "+").Result()
	require.NoError(t, err)
	for _, m := range msgs {
		md, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(m.Values)
		require.NoError(t, err)
		types = append(types, md.Metadata.Get(events.EventTypeKey))
	}
	require.Equal(t, []string{"order.placed", events.EventTypeDiscarded}, types)
}
