package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/poll"
)

// RelayWALConfig configures the relay's WAL benchmark.
type RelayWALConfig struct {
	// DatabaseURL is where fresh schemas are made; the benchmark reads the
	// server's pg_wal, so it runs on the database's host. Required.
	DatabaseURL string
	// Events is how many rows each run forwards. Defaults to 2,000.
	Events int
	// BatchSizes are the forwarder's batch sizes, one run with the audit
	// off and one with it on each. Defaults to 1 (a service's everyday
	// rate: a batch per commit) and 500 (a backlog).
	BatchSizes []int
	// Rate, when positive, writes the events at that many a second, one
	// per transaction, while the relay runs, instead of seeding a backlog:
	// a service's everyday flow, where each claim finds one event and the
	// lease ticks' fixed cost is spread over the events of an interval.
	// The write's own WAL, measured in a pass without a forwarder, is
	// taken off.
	Rate float64
	Out  io.Writer
}

// RelayWAL measures the WAL the relay writes per event, by relation, with
// the broker audit off and on (receipts): seeded pending rows are
// forwarded to a redis-server of the benchmark's own, from a CHECKPOINT on;
// with the audit on, the pass that settles the receipts (a consumer group
// past the last entry) is measured after it.
func RelayWAL(ctx context.Context, cfg RelayWALConfig) error {
	if cfg.Events <= 0 {
		cfg.Events = 2000
	}
	if len(cfg.BatchSizes) == 0 {
		cfg.BatchSizes = []int{1, 500}
	}
	rdb, stop, err := startRedis(ctx)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Fprintf(cfg.Out, "relay WAL per event, by relation (pg_waldump from a CHECKPOINT, full-page images included), %d events a run:\n", cfg.Events)
	if cfg.Rate > 0 {
		return relayTrickle(ctx, cfg, rdb)
	}
	for _, batch := range cfg.BatchSizes {
		var off float64
		for _, audit := range []bool{false, true} {
			pool, drop, err := Schema(ctx, cfg.DatabaseURL, 4)
			if err != nil {
				return err
			}
			res, err := func() (float64, error) {
				defer drop()
				topic := "wal." + uuid.NewString()[:8]
				if err := seedOutbox(ctx, pool, topic, cfg.Events, 0); err != nil {
					return 0, err
				}
				r, err := newRelayRun(ctx, pool, rdb, batch, audit)
				if err != nil {
					return 0, err
				}
				table, total, err := r.measure(ctx, pool, cfg.Events, true, nil)
				if err != nil {
					return 0, err
				}
				label := "audit off"
				if audit {
					label = "audit on (receipts)"
				}
				fmt.Fprintf(cfg.Out, "  batch %d, %s: %.0f B/event\n%s", batch, label, total, table)
				if !audit {
					return total, nil
				}
				settle, err := settleReceipts(ctx, cfg, rdb, r.broker, topic, r.f, r.meter)
				return total + settle, err
			}()
			if err != nil {
				return err
			}
			if !audit {
				off = res
			} else {
				fmt.Fprintf(cfg.Out, "  batch %d: relay and settle with receipts / relay without: %.0f / %.0f B/event = %.2fx\n\n", batch, res, off, res/off)
			}
		}
	}
	return nil
}

// relayTrickle is RelayWAL with the events written at cfg.Rate while the
// relay runs: a pass without a forwarder gives the write's WAL, taken off
// the passes with the audit off and on.
func relayTrickle(ctx context.Context, cfg RelayWALConfig, rdb *redis.Client) error {
	fmt.Fprintf(cfg.Out, "  written at %.0f events/s, one per transaction, while the relay runs (a claim per event):\n", cfg.Rate)
	var write, off float64
	for _, pass := range []string{"write only", "audit off", "audit on (receipts)"} {
		total, err := func() (float64, error) {
			pool, drop, err := Schema(ctx, cfg.DatabaseURL, 4)
			if err != nil {
				return 0, err
			}
			defer drop()
			topic := "wal." + uuid.NewString()[:8]
			r, err := newRelayRun(ctx, pool, rdb, 0, pass == "audit on (receipts)")
			if err != nil {
				return 0, err
			}
			every := time.Duration(float64(time.Second) / cfg.Rate)
			table, total, err := r.measure(ctx, pool, cfg.Events, pass != "write only", func() error {
				next := time.Now()
				for i := range cfg.Events {
					if _, err := pool.Exec(ctx, `
						INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
						VALUES (gen_random_uuid(), $1, 'payment', 'agg-' || $3::int, 1, 'payment.paid', $2::jsonb, now())`,
						topic, benchPayload, i); err != nil {
						return err
					}
					next = next.Add(every)
					time.Sleep(time.Until(next))
				}
				return nil
			})
			if err != nil {
				return 0, err
			}
			if pass == "write only" {
				fmt.Fprintf(cfg.Out, "  %s: %.0f B/event\n%s", pass, total, table)
				return total, nil
			}
			fmt.Fprintf(cfg.Out, "  %s: %.0f B/event, the relay's %.0f\n%s", pass, total, total-write, table)
			if pass == "audit off" {
				return total, nil
			}
			settle, err := settleReceipts(ctx, cfg, rdb, r.broker, topic, r.f, r.meter)
			return total + settle, err
		}()
		if err != nil {
			return err
		}
		switch pass {
		case "write only":
			write = total
		case "audit off":
			off = total
		default:
			fmt.Fprintf(cfg.Out, "  an event's write and relay: %.0f B (audit off), %.0f B (audit on, settled); the relay's part: %.0f B, %.0f B\n",
				off, total, off-write, total-write)
		}
	}
	return nil
}

// settleReceipts makes a consumer group that had every entry of topic's
// streams, runs f's audit, which settles the receipts, and prints and
// returns the WAL it wrote per event.
func settleReceipts(ctx context.Context, cfg RelayWALConfig, rdb *redis.Client, broker *redisstreams.Broker, topic string,
	f *forwarder.Forwarder, meter *walMeter) (float64, error) {
	for _, s := range broker.Streams(topic) {
		if err := rdb.XGroupCreateMkStream(ctx, s, "bench", "$").Err(); err != nil {
			return 0, err
		}
	}
	start, err := meter.mark(ctx)
	if err != nil {
		return 0, err
	}
	if err := f.Audit(ctx); err != nil {
		return 0, err
	}
	by, err := meter.since(ctx, start)
	if err != nil {
		return 0, err
	}
	table, settle := walTable(by, cfg.Events, "outbox")
	fmt.Fprintf(cfg.Out, "    the audit pass that settles them: %.0f B/event\n%s", settle, table)
	return settle, nil
}

// relayRun is one run's forwarder (not started), to a redis broker of 16
// streams, with the audit off or a pass by hand, and its WAL meter marked.
type relayRun struct {
	broker *redisstreams.Broker
	f      *forwarder.Forwarder
	meter  *walMeter
	start  string
}

// newRelayRun makes a relayRun; batch 0 is the forwarder's default.
func newRelayRun(ctx context.Context, pool *pgxpool.Pool, rdb *redis.Client, batch int, audit bool) (relayRun, error) {
	broker, err := redisstreams.New(redisstreams.Config{Client: rdb, StreamPartitions: 16})
	if err != nil {
		return relayRun{}, err
	}
	interval := time.Duration(-1)
	if audit {
		interval = time.Hour // a pass by hand: settleReceipts
	}
	f, err := forwarder.New(forwarder.Config{Pool: pool, Broker: broker, BatchSize: batch, Registerer: prometheus.NewRegistry(),
		Logger: quietLogger(), AuditInterval: interval})
	if err != nil {
		return relayRun{}, err
	}
	meter, err := newWALMeter(ctx, pool)
	if err != nil {
		return relayRun{}, err
	}
	start, err := meter.mark(ctx)
	if err != nil {
		return relayRun{}, err
	}
	return relayRun{broker: broker, f: f, meter: meter, start: start}, nil
}

// measure runs produce (nil: nothing) while r's forwarder runs (relay;
// not at all otherwise), waits for the outbox to be drained, stops the
// forwarder (it records its cursor as it stops), and returns the WAL of
// the outbox's relations since r's mark, by relation and per event.
func (r relayRun) measure(ctx context.Context, pool *pgxpool.Pool, events int, relay bool, produce func() error) (string, float64, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	if relay {
		go func() { done <- r.f.Run(rctx) }()
	} else {
		done <- nil
	}
	var err error
	if produce != nil {
		err = produce()
	}
	if err == nil && relay {
		err = poll.Until(ctx, 5*time.Millisecond, 10*time.Minute, func() (bool, error) { return outboxDrained(ctx, pool) })
	}
	cancel()
	if err := errors.Join(err, <-done); err != nil {
		return "", 0, err
	}
	by, err := r.meter.since(ctx, r.start)
	if err != nil {
		return "", 0, err
	}
	table, total := walTable(by, events, "outbox")
	return table, total, nil
}
