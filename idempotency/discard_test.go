package idempotency_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/outflowtest"
)

// markerFor is the discard marker of account's version, as the forwarder
// publishes it in place of a discarded event.
func markerFor(t *testing.T, account string, version int64) *message.Message {
	t.Helper()
	m := msgFor(t, account, version)
	m.Payload = []byte(`{}`)
	m.Metadata.Set(events.DiscardedEventTypeKey, m.Metadata.Get(events.EventTypeKey))
	m.Metadata.Set(events.EventTypeKey, events.EventTypeDiscarded)
	return m
}

// A marker goes through the ordering like an event: held when it comes
// before its predecessor, applied (by Run) once it came, and the later
// version applies after it; the handler never runs for it.
func TestDiscardMarkerIsAppliedInOrderWithoutTheHandler(t *testing.T) {
	t.Parallel()
	b, h := setup(t, idempotency.Config{RetryPollInterval: 5 * time.Millisecond, GapRetryDelay: 5 * time.Millisecond})
	_, err := h(markerFor(t, "a", 2))
	require.NoError(t, err)
	require.Equal(t, 1, b.open(), "the marker is held: its predecessor is not in")
	_, err = h(msgFor(t, "a", 1))
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = b.consumer.Run(ctx) }()
	outflowtest.WaitFor(t, 5*time.Second, "the held marker applied", func() bool { return b.open() == 0 })
	_, err = h(msgFor(t, "a", 3))
	require.NoError(t, err)

	total, applied := b.balance("a")
	require.EqualValues(t, 20, total)
	require.Equal(t, []int64{1, 3}, applied, "v3 applied after the marker of v2")
	b.mu.Lock()
	require.Equal(t, 2, b.calls, "the handler ran for v1 and v3 only")
	b.mu.Unlock()
}

// In a batch sharing one transaction, too.
func TestDiscardMarkerInABatch(t *testing.T) {
	t.Parallel()
	r := newBatchRig(t, idempotency.Config{})
	r.sendQueued(t, msgFor(t, "a", 3), markerFor(t, "a", 2), msgFor(t, "a", 1))
	total, applied := r.balance("a")
	require.EqualValues(t, 20, total)
	require.Equal(t, []int64{1, 3}, applied)
	require.Zero(t, r.open())
	r.mu.Lock()
	require.Equal(t, 3, r.calls, "the gate, v1 and v3")
	r.mu.Unlock()
}
