package consumer_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
)

func TestCheckRoutes(t *testing.T) {
	t.Parallel()
	reg := events.NewRegistry()
	require.NoError(t, reg.Register(orderPlaced{}, orderShipped{}))
	nop := func(context.Context, pgx.Tx, events.Event) error { return nil }
	handler := func(name, topic string, types ...string) consumer.Handler {
		return consumer.Handler{Name: name, Topic: topic, EventTypes: types, Func: nop}
	}
	tests := []struct {
		name   string
		routes outbox.Routes // the writer's type, passed as is
		hs     []consumer.Handler
		want   []error  // errors.Is each
		errs   []string // each named in the error
	}{
		{"routed", outbox.Routes{"order.placed": "orders", "order.shipped": "orders"},
			[]consumer.Handler{handler("fulfil", "orders", "order.placed"), handler("all", "orders")}, nil, nil},
		{"fallback", outbox.Routes{"*": "orders"},
			[]consumer.Handler{handler("fulfil", "orders", "order.placed", "order.shipped")}, nil, nil},
		{"nil routes: types only", nil,
			[]consumer.Handler{handler("fulfil", "anything", "order.placed")}, nil, nil},
		{"nil routes, typo", nil,
			[]consumer.Handler{handler("fulfil", "anything", "order.plcaed")},
			[]error{consumer.ErrUnknownEventType}, []string{`"order.plcaed"`}},
		{"topic typo", outbox.Routes{"order.placed": "orders"},
			[]consumer.Handler{handler("fulfil", "order", "order.placed")},
			[]error{consumer.ErrNotRouted}, []string{`"fulfil" reads topic "order"`, `routed to "orders"`}},
		{"topic no route produces", outbox.Routes{"order.placed": "orders"},
			[]consumer.Handler{handler("all", "shipments")},
			[]error{consumer.ErrNotRouted}, []string{`"shipments"`, "routed topics: orders"}},
		{"type not routed", outbox.Routes{"order.placed": "orders"},
			[]consumer.Handler{handler("ship", "orders", "order.shipped")},
			[]error{consumer.ErrNotRouted}, []string{`"order.shipped"`, "no route for the type"}},
		{"every mismatch", outbox.Routes{"order.placed": "orders"},
			[]consumer.Handler{handler("a", "order", "order.placed"), handler("b", "orders", "order.plcaed"), handler("c", "x")},
			[]error{consumer.ErrNotRouted, consumer.ErrUnknownEventType}, []string{`"a"`, `"b"`, `"c"`}},
		{"typed", outbox.Routes{"order.shipped": "shipments"},
			[]consumer.Handler{consumer.On("ship", "orders", func(context.Context, pgx.Tx, events.Event, orderShipped) error { return nil })},
			[]error{consumer.ErrNotRouted}, []string{`"order.shipped"`, `routed to "shipments"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := consumer.CheckRoutes(tt.routes, reg, tt.hs...)
			if tt.want == nil {
				require.NoError(t, err)
				return
			}
			for _, w := range tt.want {
				require.True(t, errors.Is(err, w), "%v is not %v", err, w)
			}
			for _, s := range tt.errs {
				require.ErrorContains(t, err, s)
			}
		})
	}
}
