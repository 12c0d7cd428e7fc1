package consumer_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/outflowtest"
)

// orderPlaced at versions 2 and 3, as two builds of one service know it:
// v2 added the currency (v1 was EUR only), v3 renamed amount to
// amount_minor.
type orderPlacedV2Build struct {
	OrderID  string `json:"order_id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

type orderPlacedV3Build struct {
	OrderID     string `json:"order_id"`
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
}

func (orderPlacedV2Build) EventType() string  { return "order.placed" }
func (orderPlacedV2Build) SchemaVersion() int { return 2 }
func (orderPlacedV3Build) EventType() string  { return "order.placed" }
func (orderPlacedV3Build) SchemaVersion() int { return 3 }

// editJSON is an upcaster that edits the payload as a map.
func editJSON(from int, edit func(map[string]json.RawMessage)) events.Upcaster {
	return events.Upcaster{From: from, Func: func(old json.RawMessage) (json.RawMessage, error) {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(old, &m); err != nil {
			return nil, err
		}
		edit(m)
		return json.Marshal(m)
	}}
}

var (
	addCurrency  = editJSON(1, func(m map[string]json.RawMessage) { m["currency"] = json.RawMessage(`"EUR"`) })
	renameAmount = editJSON(2, func(m map[string]json.RawMessage) {
		m["amount_minor"] = m["amount"]
		delete(m, "amount")
	})
)

// A producer deployed before its consumer writes order.placed v3; the
// consumer, which knows v2, neither applies it (no zero-valued amount in
// its projection) nor gives up on it: it retries it past MaxAttempts
// without marking it dead, and the aggregate's next event waits behind it.
// Once the consumer is deployed with v3, the retry applies both, in order.
func TestNewerSchemaVersionWaitsForTheConsumersDeploy(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()

	// What the v3 producer writes: the aggregate's versions 1 and 2.
	var out []forwarder.Outgoing
	var ids []string
	for v := int64(1); v <= 2; v++ {
		ev, err := events.New(ctx, events.Aggregate{Type: "order", ID: "o-1", Version: v},
			orderPlacedV3Build{OrderID: "o-1", AmountMinor: 1250 * v, Currency: "EUR"})
		require.NoError(t, err)
		msg, err := ev.Message(ctx)
		require.NoError(t, err)
		require.Equal(t, "3", msg.Metadata.Get(events.SchemaVersionKey))
		out = append(out, forwarder.Outgoing{Topic: ordersTopic, AggregateID: "o-1", Message: msg})
		ids = append(ids, ev.MessageID)
	}

	// MaxAttempts 1: any other failure would be dead at its first attempt.
	settings := idempotency.Config{MaxAttempts: 1, RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond}
	_, err := r.schema.Pool.Exec(ctx, `CREATE TABLE amounts (message_id text PRIMARY KEY, amount_minor bigint NOT NULL)`)
	require.NoError(t, err)

	v2 := events.NewRegistry()
	require.NoError(t, v2.RegisterVersioned(orderPlacedV2Build{}, addCurrency))
	cfg := r.config()
	cfg.Registry = v2
	old, err := consumer.NewWorker(cfg)
	require.NoError(t, err)
	require.NoError(t, old.Add(consumer.Handler{Name: "projection", Topic: ordersTopic, Idempotency: settings, Func: record("projection")}))
	stop := start(t, old)

	for i, err := range r.broker.Publish(ctx, out) {
		require.NoError(t, err, "publish %d", i)
	}
	outflowtest.WaitFor(t, 20*time.Second, "v3 retried past MaxAttempts, never dead, its successor held", func() bool {
		return r.count(t, `SELECT count(*) FROM dead_letters WHERE consumer = 'projection' AND message_id = $1
			AND status = 'retrying' AND attempts >= 3 AND error LIKE '%schema version 3 is newer than version 2%'`, ids[0]) == 1 &&
			r.count(t, `SELECT count(*) FROM dead_letters WHERE consumer = 'projection' AND message_id = $1 AND status = 'held'`, ids[1]) == 1
	})
	require.Zero(t, r.count(t, `SELECT count(*) FROM handled`), "nothing applied")
	require.Zero(t, r.count(t, `SELECT count(*) FROM dead_letters WHERE status = 'dead'`))
	stop()

	// The consumer's new deployment knows v3.
	v3 := events.NewRegistry()
	require.NoError(t, v3.RegisterVersioned(orderPlacedV3Build{}, addCurrency, renameAmount))
	cfg.Registry = v3
	next, err := consumer.NewWorker(cfg)
	require.NoError(t, err)
	h := consumer.On("projection", ordersTopic, func(ctx context.Context, tx pgx.Tx, ev events.Event, o orderPlacedV3Build) error {
		if _, err := tx.Exec(ctx, `INSERT INTO amounts VALUES ($1, $2)`, ev.MessageID, o.AmountMinor); err != nil {
			return err
		}
		return record("projection")(ctx, tx, ev)
	})
	h.Idempotency = settings
	require.NoError(t, next.Add(h))
	defer start(t, next)()
	outflowtest.WaitFor(t, 20*time.Second, "both applied once the consumer knows v3", func() bool {
		return r.handled(t, "projection", ids[0]) && r.handled(t, "projection", ids[1])
	})
	for i, want := range []int{1250, 2500} {
		require.Equal(t, want, r.count(t, `SELECT amount_minor FROM amounts WHERE message_id = $1`, ids[i]), "the v3 amount_minor, not a zero value")
	}
	require.Zero(t, r.count(t, `SELECT count(*) FROM dead_letters WHERE consumer = 'projection' AND status <> 'resolved'`))
}

// start runs w until the returned stop is called.
func start(t *testing.T, w *consumer.Worker) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return func() {
		cancel()
		require.NoError(t, <-done)
	}
}
