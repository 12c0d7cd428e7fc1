package kafka_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

type blob struct {
	Data string `json:"data"`
}

func (blob) EventType() string { return "blob.stored" }

// The cluster's message.max.bytes, read with DescribeConfigs when the
// backend opens, lowers the producer's limit (less a record batch's
// header, which Kafka counts): Kafka's default 1,048,588 gives 1,048,527.
func TestCeilingIsTheClustersMessageMaxBytes(t *testing.T) {
	t.Parallel()
	b := openTestKafka(t, testservers.Kafka(t))
	require.Equal(t, 1048588-61, b.Broker().(forwarder.PayloadLimiter).MaxMessageBytes())
	small := openTestKafka(t, testservers.Kafka(t, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "8192"})))
	require.Equal(t, 8192-61, small.Broker().(forwarder.PayloadLimiter).MaxMessageBytes())
}

// A topic of the backend's whose max.message.bytes is lower is the
// ceiling: the writer refuses an event over it inside the business
// transaction, and the largest event it takes is one the broker takes,
// forwarded and never parked. Another deployment's topic (another
// prefix) does not lower it.
func TestCeilingIsTheTopicsMaxMessageBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addrs := testservers.Kafka(t)
	admin, err := sarama.NewClusterAdmin(addrs, sarama.NewConfig())
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close() })
	limit, other := "4096", "2048"
	require.NoError(t, admin.CreateTopic("t.blob", &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: map[string]*string{"max.message.bytes": &limit}}, false))
	require.NoError(t, admin.CreateTopic("other.blob", &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: map[string]*string{"max.message.bytes": &other}}, false))
	b := openTestKafka(t, addrs) // prefix "t."
	lim := b.Broker().(forwarder.PayloadLimiter)
	require.Equal(t, 4096-61, lim.MaxMessageBytes())
	// Without a prefix, no topic is known to be the backend's: another
	// team's small limit does not become this service's.
	unprefixed, err := brokers.Open(ctx, brokers.Config{Kind: brokers.Kafka, Logger: kafkaTestLogger,
		Kafka: brokers.KafkaConfig{Brokers: addrs, TopicPartitions: 4, SessionTimeout: 2 * time.Second}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, unprefixed.Close()) })
	require.Greater(t, unprefixed.Broker().(forwarder.PayloadLimiter).MaxMessageBytes(), 4096, "the cluster's default alone")

	s := outflowtest.NewSchema(t)
	w, err := outbox.NewWriter(outbox.Config{Broker: b.Broker(), MaxEventBytes: -1})
	require.NoError(t, err)
	aggID := uuid.NewString()
	write := func(n int) error {
		return pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
			return w.WriteTx(ctx, tx, events.Aggregate{Type: "blob", ID: aggID, Version: 1}, blob{Data: strings.Repeat("x", n)})
		})
	}
	n := 4096
	for ; n > 0; n -= 4 {
		err := write(n)
		if err == nil {
			break
		}
		var tl *outbox.EventTooLargeError
		require.True(t, errors.As(err, &tl), "%v", err)
		require.True(t, tl.Broker, "the broker's count applies: %v", err)
		require.Equal(t, 4096-61, tl.Limit)
	}
	require.Less(t, n, 4096-61-400, "headers, key and the CloudEvents attributes count")

	fwd, err := forwarder.New(forwarder.Config{Pool: s.Pool, Broker: b.Broker(), PollInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- fwd.Run(fctx) }()
	t.Cleanup(func() { stop(); <-done })
	outflowtest.WaitFor(t, 30*time.Second, "the largest event the writer took published by Kafka", func() bool {
		var published int
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_state WHERE state = 'published'`).Scan(&published))
		parked, err := forwarder.ListParked(ctx, s.Pool, 1)
		require.NoError(t, err)
		require.Empty(t, parked, "the broker refused what the writer took")
		return published == 1
	})
}
