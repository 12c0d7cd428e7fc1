package replay_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/replay"
)

type recordingBroker struct{ got []forwarder.Outgoing }

func (b *recordingBroker) Publish(_ context.Context, msgs []forwarder.Outgoing) []error {
	b.got = append(b.got, msgs...)
	return make([]error, len(msgs))
}

// From the WAL history, events come in commit order, each once, and the
// filter applies as to the outbox.
func TestSelectFromWALHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t)
	_, err := s.Pool.Exec(ctx, `CREATE TABLE outbox_wal_history_any PARTITION OF outbox_wal_history DEFAULT`)
	require.NoError(t, err)
	// Recorded out of commit order, and one event twice (read again after
	// a relay was killed).
	_, err = s.Pool.Exec(ctx, `
		INSERT INTO outbox_wal_history (commit_lsn, position, message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		VALUES ('0/300', 1, '00000000-0000-0000-0000-000000000003', 't', 'a', 'a1', 2, 'e', '{"n":3}', now()),
		       ('0/100', 1, '00000000-0000-0000-0000-000000000001', 't', 'a', 'a1', 1, 'e', '{"n":1}', now()),
		       ('0/100', 2, '00000000-0000-0000-0000-000000000002', 't', 'b', 'b1', 1, 'e', '{"n":2}', now()),
		       ('0/300', 1, '00000000-0000-0000-0000-000000000003', 't', 'a', 'a1', 2, 'e', '{"n":3}', now())`)
	require.NoError(t, err)

	var ids []string
	require.NoError(t, replay.Select(ctx, s.Pool, replay.Filter{Source: replay.SourceWALHistory, All: true}, 2, func(rows []replay.Row) error {
		for _, r := range rows {
			ids = append(ids, r.MessageID)
		}
		return nil
	}))
	require.Equal(t, []string{"00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000002",
		"00000000-0000-0000-0000-000000000003"}, ids)
	n, err := replay.Count(ctx, s.Pool, replay.Filter{Source: replay.SourceWALHistory, AggregateType: "a"})
	require.NoError(t, err)
	require.EqualValues(t, 2, n)

	b := &recordingBroker{}
	sent, err := replay.Publish(ctx, s.Pool, b, "projector", replay.Filter{Source: replay.SourceWALHistory, AggregateType: "a"}, replay.Options{})
	require.NoError(t, err)
	require.EqualValues(t, 2, sent)
	require.Equal(t, `{"n":1}`, string(b.got[0].Message.Payload), "the text the writer emitted")
	require.Equal(t, "00000000-0000-0000-0000-000000000003", b.got[1].Message.UUID)

	require.Error(t, replay.Filter{Source: "kafka", All: true}.Validate())
}
