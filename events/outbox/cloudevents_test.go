package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/cloudevents"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// The CloudEvents attributes a broker adds at publish count in the
// writer's limit: MaxEventBytes counts them with the metadata, and the
// broker's count is of the message with them, so an event just under the
// limit without them, and over it with them, is refused at write time
// rather than found too large at publish.
func TestLimitCountsTheCloudEventsAttributes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	srv := testservers.StartNATSConfig(t, "max_payload: 4096\n")
	open := func(ce cloudevents.Config) forwarder.Broker {
		b, err := brokers.Open(ctx, brokers.Config{Kind: brokers.NATS, NATS: brokers.NATSConfig{URL: srv.URL}, CloudEvents: ce})
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Close() })
		return b.Broker()
	}
	plain, withCE := open(cloudevents.Config{Disabled: true}), open(cloudevents.Config{Source: "https://payments.example.com"})
	sizeOf := func(w *outbox.Writer, note string) (int, error) {
		err := pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
			return w.PublishTx(ctx, tx, receiptEvent(t, uuid.NewString(), 1, 0, note))
		})
		var tl *outbox.EventTooLargeError
		if errors.As(err, &tl) {
			return tl.Size, err
		}
		return 0, err
	}
	writer := func(cfg outbox.Config) *outbox.Writer {
		w, err := outbox.NewWriter(cfg)
		require.NoError(t, err)
		return w
	}

	// MaxEventBytes: the attributes' keys and values, exactly.
	ev := receiptEvent(t, uuid.NewString(), 1, 0, "x")
	msg, err := ev.Message(ctx)
	require.NoError(t, err)
	added := withCE.(forwarder.MetadataAdder).AddedMetadataBytes(forwarder.Outgoing{Topic: "invoice", AggregateID: ev.AggregateID, Message: msg})
	require.Greater(t, added, 300, "id, source, type, time, subject, ... and their prefixed keys")
	without, _ := sizeOf(writer(outbox.Config{Broker: plain, MaxEventBytes: 1}), "x")
	with, _ := sizeOf(writer(outbox.Config{Broker: withCE, MaxEventBytes: 1}), "x")
	require.Equal(t, added, with-without)

	// The broker's count: the largest note the writer takes without the
	// attributes is refused with them, by the broker's limit.
	fitsPlain := 0
	for n := 4096; n > 0; n -= 8 {
		if _, err := sizeOf(writer(outbox.Config{Broker: plain, MaxEventBytes: -1}), strings.Repeat("n", n)); err == nil {
			fitsPlain = n
			break
		}
	}
	require.NotZero(t, fitsPlain)
	_, err = sizeOf(writer(outbox.Config{Broker: withCE, MaxEventBytes: -1}), strings.Repeat("n", fitsPlain))
	var tl *outbox.EventTooLargeError
	require.True(t, errors.As(err, &tl), "%v", err)
	require.True(t, tl.Broker)
	require.Equal(t, 4096, tl.Limit)
}
