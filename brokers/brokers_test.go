package brokers_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	_ "github.com/outflow-dev/outflow/brokers/all"
)

func TestParseKind(t *testing.T) {
	tests := []struct {
		in   string
		want brokers.Kind
		err  bool
	}{
		{"redis", brokers.Redis, false},
		{" NATS ", brokers.NATS, false},
		{"kafka9", "", true},
		{"amqp", brokers.AMQP, false},
		{"", "", true},
	}
	for _, tt := range tests {
		got, err := brokers.ParseKind(tt.in)
		if tt.err {
			require.ErrorIs(t, err, brokers.ErrUnknownKind, tt.in)
			require.Contains(t, err.Error(), "known: redis, nats, amqp, kafka, sql")
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tt.want, got)
	}
}

// A configured backend that does not answer fails at Open, quickly, naming
// itself and the URL tried, password hidden.
func TestUnreachableBackendFailsAtOpen(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	for _, tt := range []struct {
		cfg  brokers.Config
		name string
	}{
		{brokers.Config{Kind: brokers.Redis, Redis: brokers.RedisConfig{URL: "redis://:s3cret@" + addr + "/0"}}, "Redis"},
		{brokers.Config{Kind: brokers.NATS, NATS: brokers.NATSConfig{URL: "nats://u:s3cret@" + addr}}, "NATS"},
		{brokers.Config{Kind: brokers.AMQP, AMQP: brokers.AMQPConfig{URL: "amqp://u:s3cret@" + addr + "/"}}, "RabbitMQ"},
		{brokers.Config{Kind: brokers.Kafka, Kafka: brokers.KafkaConfig{Brokers: []string{addr}}}, "Kafka"},
		{brokers.Config{Kind: brokers.SQL, SQL: brokers.SQLConfig{DatabaseURL: "postgres://u:s3cret@" + addr + "/outflow?sslmode=disable"}}, "PostgreSQL (sql broker)"},
	} {
		start := time.Now()
		_, err := brokers.Open(context.Background(), tt.cfg)
		require.Error(t, err)
		require.Contains(t, err.Error(), tt.name)
		require.Contains(t, err.Error(), addr)
		require.NotContains(t, err.Error(), "s3cret")
		require.Less(t, time.Since(start), 10*time.Second, "no hang")
	}
}

func ExampleImportPath() {
	k, err := brokers.ParseKind(" NATS ")
	if err != nil {
		panic(err)
	}
	fmt.Println(k, brokers.ImportPath(k))
	// Output: nats github.com/outflow-dev/outflow/brokers/nats
}
