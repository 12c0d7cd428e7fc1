package watermillbackend_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/brokertest"
	"github.com/outflow-dev/outflow/brokers/watermillbackend"
	"github.com/outflow-dev/outflow/brokers/watermillpub"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// persistent is the GoChannel setup the backend accepts.
func persistent(t *testing.T) *gochannel.GoChannel {
	t.Helper()
	gc := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	t.Cleanup(func() { gc.Close() })
	return gc
}

func newBackend(t *testing.T, cfg watermillbackend.Config) *watermillbackend.Backend {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	b, err := watermillbackend.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// cuttable is a publisher that fails, while stopped, as a publisher over a
// closed connection does. A GoChannel lives in the process and cannot be
// cut off: this is the outage the Unavailable subtest needs of it, the
// GoChannel behind it still real.
type cuttable struct {
	message.Publisher
	mu   sync.Mutex
	down bool
}

func (c *cuttable) Stop()  { c.mu.Lock(); c.down = true; c.mu.Unlock() }
func (c *cuttable) Start() { c.mu.Lock(); c.down = false; c.mu.Unlock() }

func (c *cuttable) Publish(topic string, msgs ...*message.Message) error {
	c.mu.Lock()
	down := c.down
	c.mu.Unlock()
	if down {
		return fmt.Errorf("write: %w", net.ErrClosed)
	}
	return c.Publisher.Publish(topic, msgs...)
}

// goChannelTarget is the backend over one persistent GoChannel, its
// publisher behind the cut.
func goChannelTarget(t *testing.T) (brokertest.Target, *cuttable) {
	gc := persistent(t)
	pub := &cuttable{Publisher: gc}
	b := newBackend(t, watermillbackend.Config{Publish: watermillpub.Config{Publisher: pub}, Subscriber: gc})
	return brokertest.BackendTarget(t, b), pub
}

func TestGoChannelBrokerContract(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		Open: func(t *testing.T) brokertest.Target { tg, _ := goChannelTarget(t); return tg },
		Outage: func(t *testing.T) (brokertest.Target, testservers.Outage) {
			return goChannelTarget(t)
		},
	})
}

// sqlConfig is the backend over watermill-sql's publisher and subscriber
// (a consumer group per subscriber) on dbURL, in a schema of the test's
// own: the tables as the sql backend makes them (BYTEA payloads).
func sqlConfig(t *testing.T, dbURL string) watermillbackend.Config {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pcfg.MaxConns = 10 // a polling subscription holds one while it delivers
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db := wmsql.BeginnerFromPgx(pool)
	schema := wmsql.DefaultPostgreSQLSchema{GeneratePayloadType: func(string) string { return "BYTEA" }}
	logger := watermill.NewSlogLogger(quiet)
	pub, err := wmsql.NewPublisher(db, wmsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return watermillbackend.Config{
		Publish: watermillpub.Config{Publisher: pub},
		NewSubscriber: func(group, _ string, opts brokers.SubscriberOptions) (message.Subscriber, error) {
			return wmsql.NewSubscriber(db, wmsql.SubscriberConfig{
				ConsumerGroup:    group,
				AckDeadline:      &opts.ClaimIdle,
				PollInterval:     20 * time.Millisecond,
				ResendInterval:   50 * time.Millisecond,
				RetryInterval:    100 * time.Millisecond,
				SchemaAdapter:    schema,
				OffsetsAdapter:   wmsql.DefaultPostgreSQLOffsetsAdapter{},
				InitializeSchema: true,
			}, logger)
		},
		Kind: "watermill-sql",
	}
}

func TestWatermillSQLBrokerContract(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, brokertest.Harness{
		Open: func(t *testing.T) brokertest.Target {
			s := outflowtest.NewEmptySchema(t)
			return brokertest.BackendTarget(t, newBackend(t, sqlConfig(t, s.URL)))
		},
		// A proxy in front of PostgreSQL: the backend's connections only.
		Outage: func(t *testing.T) (brokertest.Target, testservers.Outage) {
			s := outflowtest.NewEmptySchema(t)
			u, err := url.Parse(s.URL)
			if err != nil {
				t.Fatal(err)
			}
			p := testservers.StartProxy(t, u.Host)
			u.Host = p.Addr
			return brokertest.BackendTarget(t, newBackend(t, sqlConfig(t, u.String()))), p
		},
	})
}
