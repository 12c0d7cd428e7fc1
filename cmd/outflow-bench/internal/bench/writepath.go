package bench

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/apikey"
	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/migrations"
)

// WritePathConfig configures the write-path benchmark.
type WritePathConfig struct {
	// DatabaseURL is the database the benchmark creates its schemas in.
	// Required.
	DatabaseURL string
	// Clients lists the concurrency levels. Defaults to 1, 16, 64.
	Clients []int
	// Ops is how many commands each variant runs at each concurrency level.
	// Defaults to 2000.
	Ops int
	// Slices splits each cell's ops into slices that alternate between the
	// variants. Defaults to 10.
	Slices int
	// Only restricts the run to the variants named (see the table printed
	// by the benchmark); the reference of each shape always runs.
	Only []string
	Out  io.Writer
}

// wpVariant is one write-path variant: the reference schema with one
// component removed (or added), each in a schema of its own so that every
// variant runs against tables that grew the same way.
type wpVariant struct {
	name  string
	shape string // "pay" or "create"
	// setup runs once in the variant's schema after the migrations.
	setup []string
	// noOutbox runs the command without its outbox INSERT.
	noOutbox bool
	// idempotencyKey wraps the command as the HTTP API does with an
	// Idempotency-Key: a key INSERT before it, an UPDATE after it.
	idempotencyKey bool
	// merchantPerClient spreads create commands over one merchant per
	// client instead of one merchant for every client.
	merchantPerClient bool
}

// dropNotify is the reference's one change to the shipped migrations: issue
// 11 removes the outbox_notify trigger, so every other component is measured
// against the shape without it.
const dropNotify = `DROP TRIGGER outbox_notify ON outbox`

var wpVariants = []wpVariant{
	{name: "reference", shape: "pay", setup: []string{dropNotify}},
	{name: "+ outbox_notify trigger", shape: "pay"},
	{name: "- outbox INSERT", shape: "pay", setup: []string{dropNotify}, noOutbox: true},
	{name: "- ledger balance trigger", shape: "pay", setup: []string{dropNotify,
		`DROP TRIGGER ledger_entries_balanced ON ledger_entries`}},
	// The same rule checked once per ledger transaction at commit instead of
	// once per entry row: the entries' trigger keeps UPDATE and DELETE.
	{name: "balance checked per ledger tx", shape: "pay", setup: []string{dropNotify,
		`DROP TRIGGER ledger_entries_balanced ON ledger_entries`,
		`CREATE FUNCTION ledger_tx_check_balanced() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF EXISTS (
				SELECT 1 FROM ledger_entries WHERE transaction_id = NEW.id
				GROUP BY currency HAVING sum(amount) <> 0
			) THEN
				RAISE EXCEPTION 'ledger transaction % is not balanced', NEW.id
					USING ERRCODE = 'check_violation', CONSTRAINT = 'ledger_entries_balanced';
			END IF;
			RETURN NULL;
		END
		$$`,
		`CREATE CONSTRAINT TRIGGER ledger_transactions_balanced AFTER INSERT ON ledger_transactions
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ledger_tx_check_balanced()`,
		`CREATE CONSTRAINT TRIGGER ledger_entries_balanced AFTER UPDATE OR DELETE ON ledger_entries
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ledger_check_balanced()`}},
	{name: "- outbox message_id unique", shape: "pay", setup: []string{dropNotify,
		`ALTER TABLE outbox DROP CONSTRAINT outbox_message_id_key`}},
	{name: "- outbox_aggregate_version_idx", shape: "pay", setup: []string{dropNotify, `DROP INDEX outbox_aggregate_version_idx`}},
	{name: "identity CACHE 100", shape: "pay", setup: []string{dropNotify,
		`ALTER TABLE outbox ALTER COLUMN id SET CACHE 100`,
		`ALTER TABLE ledger_entries ALTER COLUMN id SET CACHE 100`}},
	{name: "- ledger foreign keys", shape: "pay", setup: []string{dropNotify,
		`ALTER TABLE ledger_transactions DROP CONSTRAINT ledger_transactions_payment_id_fkey`,
		`ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_transaction_id_fkey`}},
	{name: "- ledger_transactions_payment_idx", shape: "pay", setup: []string{dropNotify,
		`DROP INDEX ledger_transactions_payment_idx`}},
	{name: "payments fillfactor 80", shape: "pay", setup: []string{dropNotify,
		`ALTER TABLE payments SET (fillfactor = 80)`}},
	{name: "+ Idempotency-Key (HTTP)", shape: "pay", setup: []string{dropNotify}, idempotencyKey: true},

	{name: "create: reference (one merchant)", shape: "create", setup: []string{dropNotify}},
	{name: "create: a merchant per client", shape: "create", setup: []string{dropNotify}, merchantPerClient: true},
	{name: "create: - payments merchant FK", shape: "create", setup: []string{dropNotify,
		`ALTER TABLE payments DROP CONSTRAINT payments_merchant_id_fkey`}},
}

type wpSchema struct {
	wpVariant
	schema    string
	svc       *app.Service
	merchants []string
	begin     pgx.TxOptions
	apiKeyID  string // the owner of the Idempotency-Keys, as the API's caller would be
}

// WritePath measures what each component of a producer's transaction costs:
// the pay command (row lock, UPDATE payments, ledger INSERTs checked by a
// deferred constraint trigger, outbox INSERT) and the create command (INSERT
// payments referencing a merchant, outbox INSERT), each variant removing or
// adding one component, reported against its shape's reference in the same
// run.
func WritePath(ctx context.Context, cfg WritePathConfig) error {
	if cfg.DatabaseURL == "" {
		return fmt.Errorf("write-path config: DatabaseURL is required")
	}
	if len(cfg.Clients) == 0 {
		cfg.Clients = []int{1, 16, 64}
	}
	if cfg.Ops <= 0 {
		cfg.Ops = 2000
	}
	if cfg.Slices <= 0 {
		cfg.Slices = 10
	}
	var chosen []wpVariant
	for _, v := range wpVariants {
		if len(cfg.Only) == 0 || strings.Contains(v.name, "reference") ||
			slices.ContainsFunc(cfg.Only, func(s string) bool { return strings.Contains(v.name, s) }) {
			chosen = append(chosen, v)
		}
	}
	maxClients := slices.Max(cfg.Clients)

	// One pool for every variant (their schemas are chosen per transaction
	// by its BEGIN), so the run needs maxClients+2 connections whatever the
	// number of variants: the machine's max_connections is shared.
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("parse database URL: %w", err)
	}
	pcfg.MaxConns = int32(maxClients + 2)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL (run `make services-up`): %w", err)
	}
	defer pool.Close()

	writer, err := outbox.NewWriter(outbox.Config{Routes: app.Routes})
	if err != nil {
		return err
	}
	withOutbox, err := app.NewService(app.Config{Pool: pool, Events: writer})
	if err != nil {
		return err
	}
	withoutOutbox, err := app.NewService(app.Config{Pool: pool, Events: noPublish{}})
	if err != nil {
		return err
	}

	stamp := time.Now().UnixNano()
	var schemas []*wpSchema
	defer func() {
		for _, s := range schemas {
			_, _ = pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{s.schema}.Sanitize()+" CASCADE")
		}
	}()
	for i, v := range chosen {
		s := &wpSchema{wpVariant: v, schema: fmt.Sprintf("outflowbench_wp%d_%d", i, stamp), svc: withOutbox}
		if v.noOutbox {
			s.svc = withoutOutbox
		}
		schemas = append(schemas, s)
		if err := migrateSchema(ctx, pool, cfg.DatabaseURL, s.schema); err != nil {
			return fmt.Errorf("variant %q: %w", v.name, err)
		}
		// The variant's schema is named in the transaction's own BEGIN: no
		// round trip of its own, and the trigger functions (which name their
		// tables unqualified) resolve to the variant's tables.
		s.begin = pgx.TxOptions{BeginQuery: "BEGIN; SET LOCAL search_path TO " + pgx.Identifier{s.schema}.Sanitize()}
		err := pgx.BeginTxFunc(ctx, pool, s.begin, func(tx pgx.Tx) error {
			for _, q := range v.setup {
				if _, err := tx.Exec(ctx, q); err != nil {
					return fmt.Errorf("%s: %w", q, err)
				}
			}
			k, err := apikey.Create(ctx, tx, apikey.New{Name: "bench"})
			if err != nil {
				return err
			}
			s.apiKeyID = k.ID
			n := 1
			if v.merchantPerClient {
				n = maxClients
			}
			for range n {
				m, err := s.svc.CreateMerchantTx(ctx, tx, app.NewMerchant{Name: "Bench", WebhookURL: "https://bench.example/h"})
				if err != nil {
					return err
				}
				s.merchants = append(s.merchants, m.ID)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("variant %q setup: %w", v.name, err)
		}
	}

	results := make([]map[int][]sample, len(schemas))
	for i := range results {
		results[i] = make(map[int][]sample)
	}
	slice := max(cfg.Ops/cfg.Slices, 1)
	fmt.Fprintf(cfg.Out, "write-path benchmark: %d ops per variant and concurrency, in slices of %d, variants rotating, clients %v\n",
		cfg.Ops, slice, cfg.Clients)
	settle(ctx, pool)
	for _, c := range cfg.Clients {
		for i := range cfg.Slices {
			// Rotate, and reverse every other slice, so that no variant
			// always follows the same one or always runs first.
			order := make([]int, len(schemas))
			for j := range order {
				order[j] = (j + i) % len(schemas)
			}
			if i%2 == 1 {
				slices.Reverse(order)
			}
			for _, vi := range order {
				s := schemas[vi]
				var ids []string
				if s.shape == "pay" {
					if ids, err = wpPendingPayments(ctx, pool, s, slice); err != nil {
						return err
					}
				}
				smp, err := runWritePath(ctx, pool, s, ids, slice, c)
				if err != nil {
					return fmt.Errorf("%s, %d clients: %w", s.name, c, err)
				}
				results[vi][c] = append(results[vi][c], smp)
			}
		}
	}

	tw := tabwriter.NewWriter(cfg.Out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(cfg.Out)
	fmt.Fprintln(tw, "clients\tvariant\ttx/s (median slice)\tp50 ms\tp99 ms\ttx/s vs ref\tp50 vs ref\t")
	for _, c := range cfg.Clients {
		refs := map[string]stat{}
		for i, s := range schemas {
			st := summarize(results[i][c])
			st.tps = medianRate(results[i][c])
			if _, ok := refs[s.shape]; !ok {
				refs[s.shape] = st // each shape's first variant is its reference
			}
			ref := refs[s.shape]
			fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.3f\t%.3f\t%.2fx\t%.2fx\t\n", c, s.name, st.tps, ms(st.p50), ms(st.p99),
				st.tps/ref.tps, ms(st.p50)/ms(ref.p50))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return wpHOT(ctx, pool, schemas, cfg.Out)
}

// medianRate is the median of the slices' throughputs: on a shared 2-core
// machine a stall (a checkpoint, another process) lands on one slice, and the
// pooled rate would charge it to whichever variant it hit.
func medianRate(ss []sample) float64 {
	if len(ss) == 0 {
		return 0
	}
	rates := make([]float64, 0, len(ss))
	for _, s := range ss {
		rates = append(rates, float64(len(s.latencies))/s.elapsed.Seconds())
	}
	return median(rates)
}

// migrateSchema creates schema and runs the migrations in it, through a
// one-connection pool closed before it returns (the connection budget again).
func migrateSchema(ctx context.Context, admin *pgxpool.Pool, dbURL, schema string) error {
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return fmt.Errorf("parse database URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	pcfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return fmt.Errorf("parse database URL: %w", err)
	}
	pcfg.MaxConns = 1
	p, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer p.Close()
	db := stdlib.OpenDBFromPool(p)
	defer db.Close()
	if _, err := migrations.Up(ctx, db); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if _, err := appmigrations.Up(ctx, db); err != nil {
		return fmt.Errorf("migrate the app: %w", err)
	}
	return nil
}

func wpPendingPayments(ctx context.Context, pool *pgxpool.Pool, s *wpSchema, n int) ([]string, error) {
	var ids []string
	err := pgx.BeginTxFunc(ctx, pool, s.begin, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			INSERT INTO payments (id, merchant_id, amount, currency, status, version, created_at, updated_at)
			SELECT gen_random_uuid(), $1, 1000 + g, 'EUR', 'pending', 1, now(), now() FROM generate_series(1, $2) g
			RETURNING id::text`, s.merchants[0], n)
		if err != nil {
			return err
		}
		ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("seed payments: %w", err)
	}
	return ids, nil
}

// runWritePath runs n commands of s's shape on clients goroutines: pay on
// ids, or create.
func runWritePath(ctx context.Context, pool *pgxpool.Pool, s *wpSchema, ids []string, n, clients int) (sample, error) {
	var (
		mu      sync.Mutex
		lat     = make([]time.Duration, 0, n)
		next    = make(chan int)
		firstEr error
		wg      sync.WaitGroup
	)
	start := time.Now()
	for client := range clients {
		merchant := s.merchants[client%len(s.merchants)]
		wg.Go(func() {
			local := make([]time.Duration, 0, n/clients+1)
			for i := range next {
				t0 := time.Now()
				err := pgx.BeginTxFunc(ctx, pool, s.begin, func(tx pgx.Tx) error {
					key := ""
					if s.idempotencyKey {
						// The two statements of app/httpapi's claimKey and
						// saveResponse, around the command.
						key = uuid.NewString()
						if _, err := tx.Exec(ctx, `
							INSERT INTO idempotency_keys (api_key_id, key, request_hash, status_code, response_body) VALUES ($1, $2, $3, 0, '')
							ON CONFLICT (api_key_id, key) DO NOTHING`, s.apiKeyID, key, []byte("0123456789abcdef0123456789abcdef")); err != nil {
							return err
						}
					}
					var err error
					if s.shape == "pay" {
						_, err = s.svc.PayTx(ctx, tx, ids[i])
					} else {
						_, err = s.svc.CreatePaymentTx(ctx, tx, app.NewPayment{MerchantID: merchant, Amount: 1000, Currency: "EUR"})
					}
					if err != nil || key == "" {
						return err
					}
					_, err = tx.Exec(ctx, `UPDATE idempotency_keys SET status_code = $3, response_body = $4 WHERE api_key_id = $1 AND key = $2`,
						s.apiKeyID, key, 200, []byte(`{"id":"0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60","status":"paid"}`))
					return err
				})
				local = append(local, time.Since(t0))
				if err != nil {
					mu.Lock()
					if firstEr == nil {
						firstEr = err
					}
					mu.Unlock()
				}
			}
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return sample{latencies: lat, elapsed: time.Since(start)}, firstEr
}

// wpHOT prints how many of each pay variant's payment UPDATEs were HOT
// (no index entry written): what the fillfactor variant is about.
func wpHOT(ctx context.Context, pool *pgxpool.Pool, schemas []*wpSchema, out io.Writer) error {
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "variant\tpayments updates\tHOT\t")
	for _, s := range schemas {
		if s.shape != "pay" {
			continue
		}
		var upd, hot int64
		// The statistics reach the view once the backends report them.
		_, _ = pool.Exec(ctx, `SELECT pg_stat_clear_snapshot()`)
		err := pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'payments'`,
			s.schema).Scan(&upd, &hot)
		if err != nil {
			return fmt.Errorf("read table statistics: %w", err)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f%%\t\n", s.name, upd, 100*float64(hot)/float64(max(upd, 1)))
	}
	return tw.Flush()
}
