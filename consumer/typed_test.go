package consumer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

// orderShipped is registered in no test's registry but its own.
type orderShipped struct {
	OrderID string `json:"order_id"`
}

func (orderShipped) EventType() string { return "order.shipped" }

// orderPlacedV2 claims order.placed, which the rig registers as orderPlaced.
type orderPlacedV2 struct {
	OrderID string `json:"order_id"`
}

func (orderPlacedV2) EventType() string { return "order.placed" }

// pointerPayload is a payload whose pointer type is also a Payload.
type pointerPayload struct{}

func (pointerPayload) EventType() string { return "order.pointer" }

// A handler's mistakes fail Add, naming the handler and the type, instead
// of leaving it subscribed and never called.
func TestAddRefusesEventTypesTheRegistryDoesNotKnow(t *testing.T) {
	t.Parallel()
	r := &rig{schema: outflowtest.NewSchema(t), reg: events.NewRegistry()}
	require.NoError(t, r.reg.Register(orderPlaced{}))
	nop := func(context.Context, pgx.Tx, events.Event) error { return nil }
	onPlaced := func(context.Context, pgx.Tx, events.Event, orderPlaced) error { return nil }
	tests := []struct {
		name    string
		h       consumer.Handler
		is      error    // errors.Is, when set
		mention []string // the error names these
	}{
		{"typo in EventTypes", consumer.Handler{Name: "fulfil", Topic: ordersTopic, EventTypes: []string{"order.plaecd"}, Func: nop},
			consumer.ErrUnknownEventType, []string{`"fulfil"`, `"order.plaecd"`, "order.placed"}},
		{"one of two unknown", consumer.Handler{Name: "fulfil", Topic: ordersTopic, EventTypes: []string{"order.placed", "order.shipped"}, Func: nop},
			consumer.ErrUnknownEventType, []string{`"order.shipped"`}},
		{"typed, payload not registered", consumer.On("ship", ordersTopic, func(context.Context, pgx.Tx, events.Event, orderShipped) error { return nil }),
			consumer.ErrUnknownEventType, []string{`"ship"`, `"order.shipped"`}},
		{"typed, another Go type registered", consumer.On("fulfil", ordersTopic, func(context.Context, pgx.Tx, events.Event, orderPlacedV2) error { return nil }),
			consumer.ErrPayloadType, []string{"orderPlacedV2", "orderPlaced"}},
		{"typed, pointer payload", consumer.On("fulfil", ordersTopic, func(context.Context, pgx.Tx, events.Event, *pointerPayload) error { return nil }),
			nil, []string{"must be a struct type"}},
		{"OnEach, no function", consumer.OnEach("fulfil", ordersTopic), nil, []string{"no function"}},
		{"typed, EventTypes emptied", func() consumer.Handler {
			h := consumer.On("fulfil", ordersTopic, onPlaced)
			h.EventTypes = nil
			return h
		}(), nil, []string{"EventTypes was emptied"}},
		{"OnEach, two for one type", consumer.OnEach("fulfil", ordersTopic, consumer.Typed(onPlaced), consumer.Typed(onPlaced)),
			nil, []string{`two functions for event type "order.placed"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := consumer.NewWorker(consumer.WorkerConfig{Pool: r.schema.Pool, Broker: unopened{}, Registry: r.reg, Logger: quiet})
			require.NoError(t, err)
			err = w.Add(tt.h)
			require.Error(t, err)
			if tt.is != nil {
				require.ErrorIs(t, err, tt.is)
			}
			for _, m := range tt.mention {
				require.ErrorContains(t, err, m)
			}
		})
	}
	t.Run("typed, a type added by hand", func(t *testing.T) {
		reg := events.NewRegistry()
		require.NoError(t, reg.Register(orderPlaced{}, orderShipped{}))
		h := consumer.On("fulfil", ordersTopic, onPlaced)
		h.EventTypes = append(h.EventTypes, "order.shipped")
		require.ErrorContains(t, h.CheckTypes(reg), `"order.shipped", which none of its typed functions takes`)
	})
	t.Run("registered", func(t *testing.T) {
		w, err := consumer.NewWorker(consumer.WorkerConfig{Pool: r.schema.Pool, Broker: unopened{}, Registry: r.reg, Logger: quiet})
		require.NoError(t, err)
		require.NoError(t, w.Add(consumer.Handler{Name: "all", Topic: ordersTopic, Func: nop}), "no EventTypes: every type")
		require.NoError(t, w.Add(consumer.Handler{Name: "listed", Topic: ordersTopic, EventTypes: []string{"order.placed"}, Func: nop}))
		require.NoError(t, w.Add(consumer.On("typed", ordersTopic, onPlaced)))
	})
}

// On sets the handler's event types from its payload type, and its
// function gets the payload as that type; a type it does not take still
// advances the aggregate's version, unseen, as with EventTypes.
func TestOnHandsTheTypedPayload(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	require.NoError(t, r.reg.Register(orderShipped{}))
	h := consumer.On("fulfil", ordersTopic, func(ctx context.Context, tx pgx.Tx, ev events.Event, o orderPlaced) error {
		_, err := tx.Exec(ctx, `INSERT INTO handled (consumer, message_id) VALUES ($1, $2)`, "fulfil", o.OrderID+"/"+ev.MessageID)
		return err
	})
	require.Equal(t, []string{"order.placed"}, h.EventTypes)

	var (
		mu      sync.Mutex
		shipped []string
	)
	each := consumer.OnEach("audit", ordersTopic,
		consumer.Typed(func(ctx context.Context, tx pgx.Tx, ev events.Event, o orderPlaced) error {
			_, err := tx.Exec(ctx, `INSERT INTO handled (consumer, message_id) VALUES ($1, $2)`, "audit", ev.MessageID)
			return err
		}),
		consumer.Typed(func(ctx context.Context, tx pgx.Tx, ev events.Event, s orderShipped) error {
			mu.Lock()
			defer mu.Unlock()
			shipped = append(shipped, s.OrderID)
			return nil
		}),
	)
	require.ElementsMatch(t, []string{"order.placed", "order.shipped"}, each.EventTypes)

	w, err := consumer.NewWorker(r.config())
	require.NoError(t, err)
	require.NoError(t, w.Add(h))
	require.NoError(t, w.Add(each))
	run(t, w)
	ids := r.publish(t, "o-1")
	ship, err := events.New(context.Background(), events.Aggregate{Type: "order", ID: "o-1", Version: 2}, orderShipped{OrderID: "o-1"})
	require.NoError(t, err)
	msg, err := ship.Message(context.Background())
	require.NoError(t, err)
	for _, err := range r.broker.Publish(context.Background(), []forwarder.Outgoing{{Topic: ordersTopic, AggregateID: "o-1", Message: msg}}) {
		require.NoError(t, err)
	}

	outflowtest.WaitFor(t, 20*time.Second, "both handlers at version 2", func() bool {
		return r.count(t, `SELECT count(*) FROM consumer_aggregate_versions WHERE aggregate_id = 'o-1' AND version = 2`) == 2
	})
	require.True(t, r.handled(t, "fulfil", "o-1/"+ids[0]), "On's function got the orderPlaced")
	require.True(t, r.handled(t, "audit", ids[0]))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"o-1"}, shipped, "OnEach's second function got the orderShipped")
}

// A Typed function given another payload than its own (EventTypes changed
// by hand, say) fails with ErrPayloadType rather than panicking.
func TestTypedRefusesAnotherPayload(t *testing.T) {
	t.Parallel()
	h := consumer.On("fulfil", ordersTopic, func(context.Context, pgx.Tx, events.Event, orderPlaced) error { return nil })
	ev, err := events.New(context.Background(), events.Aggregate{Type: "order", ID: "o", Version: 1}, orderPlacedV2{OrderID: "o"})
	require.NoError(t, err)
	err = h.Func(context.Background(), nil, ev)
	require.True(t, errors.Is(err, consumer.ErrPayloadType), "%v", err)
}
