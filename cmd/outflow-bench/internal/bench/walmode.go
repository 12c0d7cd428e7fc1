package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/poll"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/walrelay"
)

// WALModeConfig configures the WAL mode benchmark.
type WALModeConfig struct {
	// Clients are the producer concurrency levels. Defaults to 8 and 32.
	Clients []int
	// Duration is each variant's time per level, split into Rounds
	// rotating slices. Defaults to 6s and 3.
	Duration time.Duration
	Rounds   int
	// Backlog is how many events each mode's drain starts from. Defaults
	// to 30,000.
	Backlog int
	// MaxChanges is the relay's walrelay.Config.MaxChanges. Defaults to
	// the relay's default.
	MaxChanges int
	Out        io.Writer
}

// WALMode compares, on a PostgreSQL of its own with fsync on and
// wal_level=logical, the producers' transactions/s of a lean transaction
// (one UPDATE, one INSERT) without Outflow, with table mode and with WAL
// mode, at each level of clients, the variants' slices interleaved so that
// the machine's drift hits them alike; then the rate at which the table
// forwarder drains a backlog and the WAL relay relays one of the same size,
// both to a broker that acknowledges at once (the database's side is
// measured, not a broker's).
func WALMode(ctx context.Context, cfg WALModeConfig) error {
	if len(cfg.Clients) == 0 {
		cfg.Clients = []int{8, 32}
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 6 * time.Second
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 3
	}
	if cfg.Backlog <= 0 {
		cfg.Backlog = 30_000
	}
	pg, stop, err := testservers.RunLogicalPostgres(ctx, "shared_buffers=256MB", "max_wal_size=4GB", "checkpoint_timeout=30min")
	if err != nil {
		return err
	}
	defer stop()
	maxClients := 0
	for _, c := range cfg.Clients {
		maxClients = max(maxClients, c)
	}
	pc, err := pgxpool.ParseConfig(pg.URL)
	if err != nil {
		return err
	}
	pc.MaxConns = int32(maxClients + 8)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	defer pool.Close()
	const accounts = 100_000
	if _, err := pool.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL);
		INSERT INTO accounts SELECT g, 0 FROM generate_series(1, %d) g;
		CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, account int NOT NULL, amount bigint NOT NULL,
		                     at timestamptz NOT NULL DEFAULT now())`, accounts)); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE accounts`); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// The relay's slot exists during the producers' runs, as in
	// production (a message emitted with no slot costs the same).
	relay, err := walrelay.New(walrelay.Config{Pool: pool, Broker: ackBroker{}, Logger: quiet, HistoryRetention: -1, MaxChanges: cfg.MaxChanges})
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE PUBLICATION outflow_wal`); err != nil {
		return fmt.Errorf("create publication: %w", err)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot('outflow_wal', 'pgoutput')`); err != nil {
		return fmt.Errorf("create slot: %w", err)
	}
	table, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "accounts"}})
	if err != nil {
		return err
	}
	wal, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "accounts"}, Mode: outbox.ModeWAL})
	if err != nil {
		return err
	}
	variants := []struct {
		name string
		w    *outbox.Writer
	}{{"without Outflow", nil}, {"table mode", table}, {"WAL mode", wal}}

	var seq atomic.Int64
	txn := func(ctx context.Context, w *outbox.Writer) error {
		n := seq.Add(1)
		acct := int(n%accounts) + 1
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		// The command's writes go in one batch, the event with them
		// (QueueTx): the way a service at these rates writes, and the
		// same round trips in every variant.
		b := &pgx.Batch{}
		b.Queue(`UPDATE accounts SET balance = balance + 1 WHERE id = $1`, acct)
		b.Queue(`INSERT INTO ledger (account, amount) VALUES ($1, 1)`, acct)
		if w != nil {
			ev, err := events.New(ctx, events.Aggregate{Type: "account", ID: fmt.Sprint(acct), Version: n}, credited{Amount: 1})
			if err != nil {
				return err
			}
			if err := w.QueueTx(ctx, tx, b, ev); err != nil {
				return err
			}
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	// run runs clients producers for d and returns how many committed.
	run := func(clients int, d time.Duration, w *outbox.Writer) (int64, error) {
		rctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		var done atomic.Int64
		var wg sync.WaitGroup
		var mu sync.Mutex
		var firstErr error
		for range clients {
			wg.Go(func() {
				for rctx.Err() == nil {
					if err := txn(rctx, w); err != nil {
						if rctx.Err() == nil {
							mu.Lock()
							firstErr = cmp(firstErr, err)
							mu.Unlock()
						}
						return
					}
					done.Add(1)
				}
			})
		}
		wg.Wait()
		return done.Load(), firstErr
	}

	fmt.Fprintf(cfg.Out, "WAL mode: producers of a lean transaction (UPDATE + INSERT in one batch, one event each queued with them), PostgreSQL %s of its own, fsync on; %s per variant and level in %d rotating slices\n",
		serverVersion(ctx, pool), cfg.Duration, cfg.Rounds)
	for _, clients := range cfg.Clients {
		if _, err := run(clients, time.Second, nil); err != nil { // warm-up
			return err
		}
		totals := make([]int64, len(variants))
		slice := cfg.Duration / time.Duration(cfg.Rounds)
		for r := range cfg.Rounds {
			for k := range variants {
				i := (k + r) % len(variants)
				n, err := run(clients, slice, variants[i].w)
				if err != nil {
					return fmt.Errorf("%s: %w", variants[i].name, err)
				}
				totals[i] += n
			}
		}
		base := float64(totals[0]) / cfg.Duration.Seconds()
		for i, v := range variants {
			rate := float64(totals[i]) / cfg.Duration.Seconds()
			fmt.Fprintf(cfg.Out, "  %2d clients  %-16s %8.0f tx/s  %.2fx\n", clients, v.name, rate, rate/base)
		}
	}

	// Drains: the backlog the producers left is dropped, then each mode
	// gets a backlog of cfg.Backlog events of its own.
	if _, err := pool.Exec(ctx, `TRUNCATE outbox`); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `SELECT pg_replication_slot_advance('outflow_wal', pg_current_wal_lsn())`); err != nil {
		return err
	}
	fill := func(w *outbox.Writer) error {
		per := cfg.Backlog / 8
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for c := range 8 {
			wg.Go(func() {
				for range per {
					if err := txn(ctx, w); err != nil {
						errs[c] = err
						return
					}
				}
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	if err := fill(table); err != nil {
		return err
	}
	n := (cfg.Backlog / 8) * 8
	reg := prometheus.NewRegistry()
	fwd, err := forwarder.New(forwarder.Config{Pool: pool, Broker: ackBroker{}, Logger: quiet, AuditInterval: -1, Retention: -1, Registerer: reg})
	if err != nil {
		return err
	}
	fctx, fstop := context.WithCancel(ctx)
	start := time.Now()
	fdone := make(chan error, 1)
	go func() { fdone <- fwd.Run(fctx) }()
	// Drained when the broker acknowledged every row (the forwarder's
	// counter): the outbox tells it a lease tick later.
	if err := poll.Until(ctx, 20*time.Millisecond, 10*time.Minute, func() (bool, error) {
		done, err := forwarded(reg)
		return done >= float64(n), err
	}); err != nil {
		fstop()
		return fmt.Errorf("forwarder drain: %w", err)
	}
	fwdRate := float64(n) / time.Since(start).Seconds()
	fstop()
	if err := <-fdone; err != nil {
		return err
	}

	if err := fill(wal); err != nil {
		return err
	}
	var end string
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		return err
	}
	rctx, rstop := context.WithCancel(ctx)
	start = time.Now()
	rdone := make(chan error, 1)
	go func() { rdone <- relay.Run(rctx) }()
	if err := poll.Until(ctx, 20*time.Millisecond, 10*time.Minute, func() (bool, error) {
		var ok bool
		err := pool.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'outflow_wal'`, end).Scan(&ok)
		if errors.Is(err, pgx.ErrNoRows) { // the relay has not made its slot yet
			return false, nil
		}
		return ok, err
	}); err != nil {
		rstop()
		return fmt.Errorf("relay drain: %w", err)
	}
	relayRate := float64(n) / time.Since(start).Seconds()
	rstop()
	if err := <-rdone; err != nil {
		return err
	}
	fmt.Fprintf(cfg.Out, "drain of %d events to a broker that acknowledges at once:\n", n)
	fmt.Fprintf(cfg.Out, "  table forwarder (batch 500)          %8.0f events/s\n", fwdRate)
	maxChanges := cfg.MaxChanges
	if maxChanges == 0 {
		maxChanges = walrelay.DefaultMaxChanges
	}
	fmt.Fprintf(cfg.Out, "  WAL relay (reads of %d changes)      %8.0f events/s  %.2fx\n", maxChanges, relayRate, relayRate/fwdRate)
	return nil
}

// ackBroker acknowledges every message at once.
type ackBroker struct{}

func (ackBroker) Publish(_ context.Context, msgs []forwarder.Outgoing) []error {
	return make([]error, len(msgs))
}

type credited struct {
	Amount int `json:"amount"`
}

func (credited) EventType() string { return "account.credited" }

func cmp(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func serverVersion(ctx context.Context, pool *pgxpool.Pool) string {
	var v string
	_ = pool.QueryRow(ctx, `SHOW server_version`).Scan(&v)
	return v
}
