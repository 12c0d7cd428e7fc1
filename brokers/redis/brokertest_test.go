package redis_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/brokertest"
	_ "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/internal/testservers"
)

func openBackend(t *testing.T, cfg brokers.Config) brokers.Backend {
	t.Helper()
	b, err := brokers.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestBrokerContract(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		Open: func(t *testing.T) brokertest.Target {
			prefix := testservers.UniqueName(t, testservers.Redis(t)) + "_"
			return brokertest.BackendTarget(t, openBackend(t, brokers.Config{Kind: brokers.Redis, StreamPartitions: 2,
				Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: prefix}}))
		},
		Outage: func(t *testing.T) (brokertest.Target, testservers.Outage) {
			srv := testservers.StartRedis(t)
			return brokertest.BackendTarget(t, openBackend(t, brokers.Config{Kind: brokers.Redis,
				Redis: brokers.RedisConfig{URL: srv.URL}})), srv
		},
	})
}

// This test binary links the redis backend only: the others are known but
// not linked, and Open says which import adds one.
func TestOpenOfAnUnlinkedBackendNamesItsImport(t *testing.T) {
	t.Parallel()
	_, err := brokers.Open(context.Background(), brokers.Config{Kind: brokers.NATS})
	if !errors.Is(err, brokers.ErrNotLinked) {
		t.Fatalf("got %v, want ErrNotLinked", err)
	}
	for _, want := range []string{`import _ "github.com/outflow-dev/outflow/brokers/nats"`, "github.com/outflow-dev/outflow/brokers/all"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("%q does not say %q", err, want)
		}
	}
	if _, err := brokers.Open(context.Background(), brokers.Config{Kind: "carrier-pigeon"}); !errors.Is(err, brokers.ErrUnknownKind) {
		t.Fatalf("an unknown kind: got %v, want ErrUnknownKind", err)
	}
}

// Lag and Ping on two partitions; the outage is a redis-server of the
// test's own. Not CountsUnacked: the subscriber acknowledges a read's
// entries together once all of them are settled (or it stops), so while it
// runs the lag includes acked entries of a read not settled yet.
func TestObserveContract(t *testing.T) {
	t.Parallel()
	brokertest.RunObserve(t, brokertest.ObserveHarness{
		Open: func(t *testing.T) brokers.Backend {
			prefix := testservers.UniqueName(t, testservers.Redis(t)) + "_"
			return openBackend(t, brokers.Config{Kind: brokers.Redis, StreamPartitions: 2,
				Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: prefix}})
		},
		Outage: func(t *testing.T) (brokers.Backend, testservers.Outage) {
			srv := testservers.StartRedis(t)
			return openBackend(t, brokers.Config{Kind: brokers.Redis, Redis: brokers.RedisConfig{URL: srv.URL}}), srv
		},
	})
}
