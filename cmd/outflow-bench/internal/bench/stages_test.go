package bench

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
)

type plainBroker struct{}

func (plainBroker) Publish(context.Context, []forwarder.Outgoing) []error { return nil }

type limitingBroker struct{ plainBroker }

func (limitingBroker) MaxMessageBytes() int                { return 7 }
func (limitingBroker) MessageBytes(forwarder.Outgoing) int { return 3 }

type auditingBroker struct{ plainBroker }

func (auditingBroker) PublishReceipts(context.Context, []forwarder.Outgoing) ([]forwarder.Receipt, []error) {
	return nil, nil
}

func (auditingBroker) Check(context.Context, string, []byte, []forwarder.Held, bool) (forwarder.Verdict, error) {
	return forwarder.Verdict{}, nil
}

type auditingLimitingBroker struct{ auditingBroker }

func (auditingLimitingBroker) MaxMessageBytes() int                { return 7 }
func (auditingLimitingBroker) MessageBytes(forwarder.Outgoing) int { return 3 }

// The timing wrapper must leave the forwarder the broker it wraps: an
// Auditor publishes through PublishReceipts, a PayloadLimiter bounds the
// claim, and a wrapper that hid either would measure another forwarder.
func TestTimedKeepsTheBrokersInterfaces(t *testing.T) {
	for _, tc := range []struct {
		name           string
		inner          forwarder.Broker
		audits, limits bool
	}{
		{"plain", plainBroker{}, false, false},
		{"limiter", limitingBroker{}, false, true},
		{"auditor", auditingBroker{}, true, false},
		{"both", auditingLimitingBroker{}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := timed(tc.inner, newStageClock())
			_, audits := b.(forwarder.Auditor)
			l, limits := b.(forwarder.PayloadLimiter)
			if audits != tc.audits || limits != tc.limits {
				t.Fatalf("Auditor %v, PayloadLimiter %v; want %v, %v", audits, limits, tc.audits, tc.limits)
			}
			if limits && (l.MaxMessageBytes() != 7 || l.MessageBytes(forwarder.Outgoing{}) != 3) {
				t.Fatalf("the limits are not the wrapped broker's")
			}
		})
	}
}

func TestQuantileIsNearestRank(t *testing.T) {
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	for _, tc := range []struct {
		name   string
		sorted []int
		q      float64
		want   int
	}{
		{"empty", nil, 0.99, 0},
		{"one", []int{7}, 0.5, 7},
		{"median of four: the 2nd", []int{1, 2, 3, 4}, 0.5, 2},
		{"p99 of 100: the 99th, not the max", hundred, 0.99, 99},
		{"p50 of 100", hundred, 0.5, 50},
		{"max", hundred, 1, 100},
		{"min", hundred, 0, 1},
	} {
		if got := quantile(tc.sorted, tc.q); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// The five parts and the p99 of the others are of the events never held
// as a gap: the worker's middleware saw a held one done when it was
// parked, not when its dead letter resolved, so counted it would shorten
// the tail it is set beside.
func TestStagesLeaveHeldEventsOut(t *testing.T) {
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "bench"}})
	require.NoError(t, err)
	var ids []string
	for v := range int64(2) {
		ev, err := events.New(ctx, events.Aggregate{Type: paymentevents.AggregateType, ID: "pay-1", Version: v + 1}, benchPayment(1, v+1))
		require.NoError(t, err)
		require.NoError(t, pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error { return w.PublishTx(ctx, tx, ev) }))
		ids = append(ids, ev.MessageID)
	}
	// The second arrived before the first and was held.
	_, err = s.Pool.Exec(ctx, `
		INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, metadata, status, reason, resolved_at)
		SELECT 'sync-analytics', message_id, event_type, aggregate_type, aggregate_id, aggregate_version, ''::bytea, '{}', 'resolved', 'gap', now()
		FROM outbox WHERE message_id = $1`, ids[1])
	require.NoError(t, err)

	all, err := neverHeld(ctx, s.Pool, window{})
	require.NoError(t, err)
	require.Len(t, all, 1)
	require.Equal(t, ids[0], all[0].id)

	// Each message's steps 1 ms apart, and in the worker 5 ms for the
	// first; the held one's 500 ms would be every p99 of two.
	c, a := newStageClock(), &ackTimes{at: map[string]time.Time{}, received: map[string]time.Time{}}
	at := all[0].at
	for i, id := range ids {
		c.committed[id] = at.Add(time.Millisecond)
		c.published[id] = publishCall{at.Add(2 * time.Millisecond), at.Add(3 * time.Millisecond)}
		a.received[id] = at.Add(4 * time.Millisecond)
		a.at[id] = at.Add(time.Duration(9+i*495) * time.Millisecond)
	}
	got := c.stages(a, all)
	require.Equal(t, stageP99s{commit: 1, toPublish: 1, publish: 1, toWorker: 1, inWorker: 5, fromCommit: 8}, got)
	require.Equal(t, 9.0, a.p99NeverHeld(all))
}
