package handlers_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// outageBackend opens a backend whose server the test can take down: a
// server of the test's own where one is cheap to start (redis-server,
// nats-server, kfake), a proxy in front of the shared one where it is not
// (RabbitMQ, PostgreSQL): shared services are never stopped.
type outageBackend struct {
	kind brokers.Kind
	open func(t *testing.T) (brokers.Config, testservers.Outage)
}

var outageBackends = []outageBackend{
	{brokers.Redis, func(t *testing.T) (brokers.Config, testservers.Outage) {
		srv := testservers.StartRedis(t)
		return brokers.Config{Kind: brokers.Redis, StreamPartitions: 2, Redis: brokers.RedisConfig{URL: srv.URL}}, srv
	}},
	{brokers.NATS, func(t *testing.T) (brokers.Config, testservers.Outage) {
		srv := testservers.StartNATS(t)
		return brokers.Config{Kind: brokers.NATS, StreamPartitions: 2,
			NATS: brokers.NATSConfig{URL: srv.URL, PublishTimeout: 500 * time.Millisecond}}, srv
	}},
	{brokers.AMQP, func(t *testing.T) (brokers.Config, testservers.Outage) {
		u, err := url.Parse(testservers.AMQPURL())
		require.NoError(t, err)
		proxy := testservers.StartProxy(t, u.Host)
		u.Host = proxy.Addr
		groups := map[string][]string{app.PaymentsTopic: {"sync-analytics", "notify-merchant", "counter"}}
		return brokers.Config{Kind: brokers.AMQP, StreamPartitions: 2,
			AMQP: brokers.AMQPConfig{URL: u.String(), Prefix: testservers.AMQPPrefix(t, 2, groups), Groups: groups}}, proxy
	}},
	{brokers.Kafka, func(t *testing.T) (brokers.Config, testservers.Outage) {
		k := testservers.StartKafka(t)
		// A member cut off by the outage is replaced after SessionTimeout
		// (the default's 10 s was most of the wait after the outage), and a
		// publish to the broker that is down fails after DialTimeout.
		return brokers.Config{Kind: brokers.Kafka, Kafka: brokers.KafkaConfig{Brokers: k.Addrs, TopicPartitions: 4,
			SessionTimeout: 2 * time.Second, DialTimeout: time.Second}}, k
	}},
	{brokers.SQL, func(t *testing.T) (brokers.Config, testservers.Outage) {
		s := outflowtest.NewEmptySchema(t)
		u, err := url.Parse(s.URL)
		require.NoError(t, err)
		proxy := testservers.StartProxy(t, u.Host)
		u.Host = proxy.Addr
		return brokers.Config{Kind: brokers.SQL,
			SQL: brokers.SQLConfig{DatabaseURL: u.String(), TablePrefix: "outflow_", PollInterval: 20 * time.Millisecond}}, proxy
	}},
}

// The broker goes down mid-run, with the forwarder and a worker running,
// and comes back: the forwarder burns no attempt (MaxAttempts 2 would park
// every row otherwise) and drains what was committed meanwhile, the worker
// reconnects by itself, every effect is there once. On every backend.
func TestBrokerOutageMidRun(t *testing.T) {
	t.Parallel()
	for _, b := range outageBackends {
		t.Run(string(b.kind), func(t *testing.T) {
			t.Parallel()
			cfg, srv := b.open(t)
			brokerOutage(t, cfg, srv)
		})
	}
}

func brokerOutage(t *testing.T, cfg brokers.Config, srv testservers.Outage) {
	p := newPipeline(t)
	p.backend = openBackend(t, cfg)
	ctx := context.Background()
	m, site := p.newMerchant(t)
	counter, counted := countingHandler(t, p)

	want := p.drive(t, m.ID, 10)
	reg := prometheus.NewRegistry()
	// PublishTimeout: a batch the outage left hanging is given up (and
	// sent again, no attempt burnt) after 2 s, not the default 10 s.
	f, err := forwarder.New(forwarder.Config{Pool: p.schema.Pool, Broker: p.backend.Broker(), PollInterval: 50 * time.Millisecond,
		BatchSize: 20, MaxAttempts: 2, OutageBackoffMax: 200 * time.Millisecond, PublishTimeout: 2 * time.Second,
		Registerer: reg, Logger: quiet})
	require.NoError(t, err)
	run(t, f.Run)
	w := p.worker(t, 2*time.Second, counter)
	run(t, w.Run)
	// Every consumer has applied the first events, and the worker is
	// subscribed to every topic (its replay topics too, which it
	// subscribes after the first ones already consume): each has its
	// group's position on the broker when the outage begins. A subscribe
	// cut by the outage fails the worker's start, as it is meant to.
	outflowtest.WaitFor(t, 30*time.Second, "the first events applied by every consumer, every topic subscribed", func() bool {
		return p.stats(t, m.ID) == want && len(counted()) == p.events(t) && w.Ready() == nil
	})

	srv.Stop()
	more := p.drive(t, m.ID, 10) // committed while the broker is down
	want.PaidCount += more.PaidCount
	want.PaidAmount = want.PaidAmount.Plus(more.PaidAmount)
	want.RefundedAmount = want.RefundedAmount.Plus(more.RefundedAmount)
	outflowtest.WaitFor(t, 20*time.Second, "the forwarder to meet the outage", func() bool {
		return metricSum(t, reg, "outflow_forwarder_broker_unavailable_total") >= 3
	})
	srv.Start()

	outflowtest.WaitFor(t, 90*time.Second, "everything applied after the outage", func() bool {
		return p.stats(t, m.ID) == want && len(counted()) == p.events(t)
	})
	p.requireCountedOnce(t, counted)
	site.requireWebhooks(t, p)
	require.Equal(t, want, p.stats(t, m.ID), "the projection still matches the payments")
	var touched int
	require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_failures WHERE attempts > 0 OR parked_at IS NOT NULL`).Scan(&touched))
	require.Zero(t, touched, "an outage burns no attempt and parks nothing")
	var parked int
	require.NoError(t, p.schema.Pool.QueryRow(ctx, `SELECT count(*) FROM dead_letters WHERE status IN ('retrying', 'dead')`).Scan(&parked))
	require.Zero(t, parked, "no consumer failed a message")
}

// events counts the outbox rows.
func (p *pipeline) events(t *testing.T) int {
	var n int
	require.NoError(t, p.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n))
	return n
}

func metricSum(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
