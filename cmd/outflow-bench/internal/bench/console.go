package bench

import (
	"context"
	"crypto/md5" // the seed's message ids, as its SQL derives them: not a digest
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/app/apikey"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/internal/console"
)

// ConsoleConfig sizes the console's render benchmark.
type ConsoleConfig struct {
	DatabaseURL string
	// Outbox rows seeded: payments of four events each; 1% of them still
	// pending and 1 in 1,000 parked, the rest published.
	Outbox int
	// Processed rows seeded in processed_messages: the published events,
	// each handled by as many consumers as it takes to reach this count.
	Processed int
	// Dead letters seeded, spread over the payments.
	Dead int
	// Renders is how many times each page is rendered (after Warmup).
	Renders int
	Warmup  int
	Out     io.Writer
}

// Defaults of ConsoleConfig: the sizes issue 16 names.
const (
	DefaultConsoleOutbox    = 1_000_000
	DefaultConsoleProcessed = 10_000_000
	DefaultConsoleDead      = 100_000
	DefaultConsoleRenders   = 200
)

// ConsoleTarget is the server-side render time issue 16 asks of the
// overview and of an event's journey.
const ConsoleTarget = 100 * time.Millisecond

// Console seeds a schema of its own with cfg's sizes and measures how long
// the console's handler takes to render the overview and an event's
// journey, called in-process (server side only: no network, no browser).
func Console(ctx context.Context, cfg ConsoleConfig) error {
	if cfg.Outbox < 8 || cfg.Processed < 0 || cfg.Dead < 0 || cfg.Renders < 1 {
		return errors.New("console bench: need Outbox >= 8, Processed and Dead >= 0, Renders >= 1")
	}
	pool, drop, err := Schema(ctx, cfg.DatabaseURL, 8)
	if err != nil {
		return err
	}
	defer drop()
	out := cfg.Out

	fmt.Fprintf(out, "## console render: %d outbox rows, %d processed messages, %d dead letters\n\n",
		cfg.Outbox, cfg.Processed, cfg.Dead)
	consumers, err := seedConsole(ctx, pool, cfg, out)
	if err != nil {
		return err
	}

	h, err := console.New(console.Config{Pool: pool, Logger: quietLogger(), InsecureCookie: true, Consumers: consumers,
		Lag: benchLag{}})
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	cookie, err := consoleLogin(ctx, pool, h)
	if err != nil {
		return err
	}
	// A full hour of samples, as Console.Run leaves after an hour: the
	// overview's charts and its rules over time read all of them. Each is
	// a real sample (the overview's reads at full size), stamped 5 s apart.
	start := time.Now()
	samples := int(time.Hour / console.DefaultRateSampleInterval)
	partial := 0 // samples with a read that failed or passed ReadTimeout: kept without it, as Run does
	for i := range samples {
		at := start.Add(-time.Hour + time.Duration(i+1)*console.DefaultRateSampleInterval)
		if err := h.SampleAt(ctx, at); err != nil {
			if ctx.Err() != nil {
				return err
			}
			partial++
		}
	}
	fmt.Fprintf(out, "An hour of samples (%d, each the overview's reads at full size) taken in %s; %d with a read left out (ReadTimeout).\n\n",
		samples, time.Since(start).Round(100*time.Millisecond), partial)

	// A payment in the middle of the table with a dead letter (seeded on
	// every aggregate whose number is a multiple of the spacing below).
	agg := consoleAggregateID(int64(cfg.Outbox/4/2) / deadSpacing(cfg) * deadSpacing(cfg))
	var msgID string
	if err := pool.QueryRow(ctx, `SELECT message_id::text FROM outbox o WHERE aggregate_type = 'payment' AND aggregate_id = $1
		AND NOT EXISTS (SELECT 1 FROM outbox_failures f WHERE f.id = o.id) ORDER BY aggregate_version LIMIT 1`, agg).Scan(&msgID); err != nil {
		return fmt.Errorf("pick a payment: %w", err)
	}

	fmt.Fprintf(out, "| page | renders | p50 | p99 | max | target | verdict |\n| --- | ---: | ---: | ---: | ---: | ---: | --- |\n")
	// A journey that found nothing would be fast and meaningless: each must
	// show the payment's four events.
	fourEvents := func(body string) error {
		if n := strings.Count(body, `class="event"`); n != 4 {
			return fmt.Errorf("the journey shows %d events, want 4", n)
		}
		return nil
	}
	// A page of the long-lived aggregate: a full one, and for a message id
	// the message's (marked).
	fullPage := func(focus bool) func(string) error {
		return func(body string) error {
			if n := strings.Count(body, `class="event"`); n != console.DefaultPageSize {
				return fmt.Errorf("the journey shows %d events, want a page of %d", n, console.DefaultPageSize)
			}
			if focus && !strings.Contains(body, `data-focus="true"`) {
				return errors.New("the message looked up is not on its page")
			}
			return nil
		}
	}
	// The overview must show its status line and the hour's charts drawn
	// (a rate, a lag per consumer, three failures' lines).
	healthAtAGlance := func(body string) error {
		if !strings.Contains(body, `id="health-state"`) {
			return errors.New("the overview has no status line")
		}
		if n, want := strings.Count(body, `<polyline class="series"`), 1+len(consumers)+3; n != want {
			return fmt.Errorf("the overview's charts draw %d lines, want %d", n, want)
		}
		return nil
	}
	// A page of webhook deliveries of each filter (or all of them, fewer
	// than a page at a small size).
	webhookPage := func(body string) error {
		if n := strings.Count(body, `class="webhook-row"`); n != console.DefaultPageSize && n != cfg.Outbox/4/500 {
			return fmt.Errorf("the webhooks list shows %d deliveries, want a page of %d", n, console.DefaultPageSize)
		}
		return nil
	}
	long, middle := consoleAggregateID(int64(cfg.Outbox/4)), consoleLongMessageID(consoleLongEvents/2)
	for _, page := range []struct {
		name, path string
		check      func(string) error
	}{
		{"overview (/), with its status line and the hour's charts", "/", healthAtAGlance},
		{"overview fragment (/fragments/overview)", "/fragments/overview", healthAtAGlance},
		{"webhooks, failing and failed (/webhooks)", "/webhooks", webhookPage},
		{"webhooks, failing, a page deep", "/webhooks?status=failing&after=" + strconv.Itoa(cfg.Outbox/4/2), webhookPage},
		{"webhooks, failed", "/webhooks?status=failed", webhookPage},
		{"journey by payment id", "/journey?q=" + url.QueryEscape(agg), fourEvents},
		{"journey by message id", "/journey?q=" + url.QueryEscape(msgID), fourEvents},
		{fmt.Sprintf("journey of a %d-event aggregate (its newest page)", consoleLongEvents),
			"/journey?q=" + url.QueryEscape(long), fullPage(false)},
		{fmt.Sprintf("journey by message id, v%d of it", consoleLongEvents/2),
			"/journey?q=" + url.QueryEscape(middle), fullPage(true)},
	} {
		d, err := renderTimes(ctx, h, cookie, page.path, cfg.Warmup, cfg.Renders, page.check)
		if err != nil {
			return fmt.Errorf("%s: %w", page.name, err)
		}
		p50, p99, worst := d[len(d)/2], d[min(len(d)-1, len(d)*99/100)], d[len(d)-1]
		verdict := "meets"
		if p99 > ConsoleTarget {
			verdict = "MISSES"
		}
		fmt.Fprintf(out, "| %s | %d | %s | %s | %s | %s | %s |\n", page.name, cfg.Renders,
			msStr(p50), msStr(p99), msStr(worst), msStr(ConsoleTarget), verdict)
	}
	fmt.Fprintln(out)

	// Where the overview's time goes: the library reads it calls, each
	// timed alone (its webhook counts are the console's own query).
	fmt.Fprintf(out, "| overview read | p50 | p99 |\n| --- | ---: | ---: |\n")
	for _, q := range []struct {
		name string
		read func(context.Context) error
	}{
		{"forwarder.ReadStats (pending and parked outbox rows)", func(ctx context.Context) error {
			_, err := forwarder.ReadStats(ctx, pool)
			return err
		}},
		{"idempotency.ReadDeadLetterCounts (held, retrying, dead per consumer)", func(ctx context.Context) error {
			_, err := idempotency.ReadDeadLetterCounts(ctx, pool)
			return err
		}},
	} {
		d := make([]time.Duration, 0, cfg.Renders)
		for i := range cfg.Warmup + cfg.Renders {
			start := time.Now()
			if err := q.read(ctx); err != nil {
				return fmt.Errorf("%s: %w", q.name, err)
			}
			if i >= cfg.Warmup {
				d = append(d, time.Since(start))
			}
		}
		slices.Sort(d)
		fmt.Fprintf(out, "| %s | %s | %s |\n", q.name, msStr(d[len(d)/2]), msStr(d[min(len(d)-1, len(d)*99/100)]))
	}
	fmt.Fprintln(out)
	return nil
}

// benchLag is a broker that answers every consumer's lag at once: the
// benchmark measures the console and its database, not a broker's round
// trips (the overview asks them beside its reads, bounded by ReadTimeout).
type benchLag struct{}

func (benchLag) Lag(_ context.Context, group, _ string) (brokers.Lag, error) {
	return brokers.Lag{Events: int64(len(group)) * 100, OldestAge: time.Duration(len(group)) * time.Second}, nil
}

func msStr(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// renderTimes serves path warmup+n times to h and returns the n durations,
// sorted; any answer but 200, or a first body check refuses, is an error.
func renderTimes(ctx context.Context, h http.Handler, cookie *http.Cookie, path string, warmup, n int,
	check func(string) error,
) ([]time.Duration, error) {
	d := make([]time.Duration, 0, n)
	for i := range warmup + n {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		req := httptest.NewRequestWithContext(ctx, http.MethodGet, path, nil)
		req.AddCookie(cookie)
		rec := httptest.NewRecorder()
		start := time.Now()
		h.ServeHTTP(rec, req)
		took := time.Since(start)
		if rec.Code != http.StatusOK {
			return nil, fmt.Errorf("GET %s: status %d: %.200s", path, rec.Code, rec.Body.String())
		}
		if i == 0 && check != nil {
			if err := check(rec.Body.String()); err != nil {
				return nil, fmt.Errorf("GET %s: %w", path, err)
			}
		}
		if i >= warmup {
			d = append(d, took)
		}
	}
	slices.Sort(d)
	return d, nil
}

// consoleLogin creates an admin key and logs in with it, as an operator
// would, and returns the session cookie.
func consoleLogin(ctx context.Context, pool *pgxpool.Pool, h http.Handler) (*http.Cookie, error) {
	key, err := apikey.Create(ctx, pool, apikey.New{Name: "bench admin"})
	if err != nil {
		return nil, fmt.Errorf("create an admin key: %w", err)
	}
	form := url.Values{"api_key": {key.Secret}}
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	for _, c := range rec.Result().Cookies() {
		if c.Name == "outflow_console" && c.Value != "" {
			return c, nil
		}
	}
	return nil, fmt.Errorf("console login: status %d and no session cookie", rec.Code)
}

// consumerNames are the seeded consumers; processed_messages holds a row
// per published event for as many of them as its size asks.
func consumerNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("consumer-%02d", i)
	}
	return names
}

func deadSpacing(cfg ConsoleConfig) int64 {
	payments := int64(cfg.Outbox / 4)
	if cfg.Dead == 0 || int64(cfg.Dead) >= payments {
		return 1
	}
	return payments / int64(cfg.Dead)
}

// The long-lived aggregate (an account's, a merchant's history): its
// journey is paged, and a page must cost what a payment's journey costs.
// Its last 10 events are pending. The message id of its version v is
// md5('long' || v) as a uuid.
const (
	consoleLongEvents     = 20_000
	consoleLongMessageSQL = `md5('long' || v)::uuid`
)

func consoleLongMessageID(v int) string {
	h := fmt.Sprintf("%x", md5.Sum([]byte("long"+strconv.Itoa(v))))
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// consoleAggregateID is payment number g's id: a UUID, as the service's.
func consoleAggregateID(g int64) string {
	h := fmt.Sprintf("%032x", g)
	return h[0:8] + "-" + h[8:12] + "-4" + h[13:16] + "-8" + h[17:20] + "-" + h[20:32]
}

// seedConsole fills the schema with set-based statements (INSERT ...
// SELECT generate_series: one statement per table, the tables logged as in
// production), dropping the big secondary indexes during the load and
// building them after, and prints how long each step took.
func seedConsole(ctx context.Context, pool *pgxpool.Pool, cfg ConsoleConfig, out io.Writer) ([]console.Consumer, error) {
	payments := cfg.Outbox / 4
	published := payments * 4
	// 99 in 100 payments are handled (the others wait at their consumers);
	// each of their events is processed
	// by as many consumers as it takes to reach cfg.Processed rows.
	handled := published / 100 * 99
	nConsumers := max(1, min(30, (cfg.Processed+handled-1)/max(1, handled)))
	names := consumerNames(nConsumers)
	consumers := make([]console.Consumer, len(names))
	for i, n := range names {
		consumers[i] = console.Consumer{Name: n, Topic: "payments"}
	}
	spacing := deadSpacing(cfg)

	// The aggregate id of payment g, in SQL, as consoleAggregateID.
	const aggSQL = `(substr(lpad(to_hex(%[1]s), 32, '0'), 1, 8) || '-' || substr(lpad(to_hex(%[1]s), 32, '0'), 9, 4) || '-4' ||
		substr(lpad(to_hex(%[1]s), 32, '0'), 14, 3) || '-8' || substr(lpad(to_hex(%[1]s), 32, '0'), 18, 3) || '-' ||
		substr(lpad(to_hex(%[1]s), 32, '0'), 21, 12))`
	agg := func(expr string) string { return fmt.Sprintf(aggSQL, expr) }
	// The message id of event g (0-based over the outbox): md5 as a uuid.
	const msgSQL = `md5('m' || %s)::uuid`
	msg := func(expr string) string { return fmt.Sprintf(msgSQL, expr) }

	steps := []struct{ name, sql string }{
		{"drop secondary indexes", `DO $$ BEGIN
			EXECUTE 'ALTER TABLE processed_messages DROP CONSTRAINT processed_messages_pkey';
			EXECUTE 'DROP INDEX processed_messages_processed_at_idx';
		END $$`},
		{fmt.Sprintf("outbox: %d rows", published), fmt.Sprintf(`
			INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type,
			                    payload, metadata, occurred_at, created_at)
			SELECT %s, 'payments', 'payment', %s, v,
			       (ARRAY['payment.created','payment.paid','payment.refunded','payment.refunded'])[v],
			       jsonb_build_object('amount', 1000 + p %% 5000, 'currency', 'EUR', 'merchant_id', 'm-' || (p %% 100)),
			       '{"correlation_id":"bench"}'::jsonb, ts, ts
			FROM generate_series(0, %d) p, generate_series(1, 4) v,
			     LATERAL (SELECT now() - interval '14 days' + (p * 4 + v) * interval '1 ms' * (1209600000 / %d) AS ts) t`,
			msg("(p * 4 + v - 1)"), agg("p"), payments-1, published)},
		{fmt.Sprintf("outbox: a long-lived aggregate of %d events", consoleLongEvents), fmt.Sprintf(`
			INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type,
			                    payload, metadata, occurred_at, created_at)
			SELECT %s, 'payments', 'payment', '%s', v, 'payment.paid',
			       jsonb_build_object('amount', 1000 + v %% 5000, 'currency', 'EUR'), '{"correlation_id":"bench"}'::jsonb,
			       now() - interval '14 days' + v * interval '1 s', now() - interval '14 days' + v * interval '1 s'
			FROM generate_series(1, %d) v ORDER BY v`,
			consoleLongMessageSQL, consoleAggregateID(int64(payments)), consoleLongEvents)},
		// Off the normal path, as the forwarder leaves them: 1 payment in
		// 1000 has its first event parked and the others held behind it.
		{"outbox_failures: parked and held rows", fmt.Sprintf(`
			INSERT INTO outbox_failures (id, aggregate_type, aggregate_id, kind, attempts, last_error, parked_at)
			SELECT o.id, o.aggregate_type, o.aggregate_id, CASE WHEN o.aggregate_version = 1 THEN 'failed' ELSE 'held' END,
			       CASE WHEN o.aggregate_version = 1 THEN 10 ELSE 0 END,
			       CASE WHEN o.aggregate_version = 1 THEN 'broker refused: message too large' END,
			       CASE WHEN o.aggregate_version = 1 THEN o.created_at + interval '1 minute' END
			FROM generate_series(999, %d, 1000) p JOIN outbox o ON o.aggregate_type = 'payment' AND o.aggregate_id = %s`,
			payments-1, agg("p"))},
		{fmt.Sprintf("processed_messages: %d rows (%d consumers)", min(cfg.Processed, handled*nConsumers), nConsumers), fmt.Sprintf(`
			INSERT INTO processed_messages (message_id, consumer, processed_at)
			SELECT %s, 'consumer-' || lpad(c::text, 2, '0'), now() - interval '14 days' + g * interval '1 ms'
			FROM generate_series(0, %d) c, generate_series(0, %d) g
			WHERE g / 4 %% 100 <> 99
			LIMIT %d`,
			msg("g"), nConsumers-1, published-1, cfg.Processed)},
		{fmt.Sprintf("dead_letters: %d rows", cfg.Dead), fmt.Sprintf(`
			INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version,
			                          payload, metadata, status, reason, error, attempts, created_at, resolved_at)
			SELECT 'consumer-' || lpad((d %% %d)::text, 2, '0'), %s, 'payment.paid', 'payment', %s, 2,
			       convert_to('{"amount":1000}', 'UTF8'), '{}'::jsonb,
			       (ARRAY['dead','dead','resolved','discarded','held','retrying'])[1 + d %% 6],
			       'handler failed', 'ledger export: account closed', 8, now() - d * interval '1 s',
			       CASE WHEN d %% 6 IN (2, 3) THEN now() END
			FROM generate_series(0, %d) d`, nConsumers, msg("((d * "+fmt.Sprint(spacing)+") * 4 + 1)"),
			agg(fmt.Sprintf("(d * %d)", spacing)), cfg.Dead-1)},
		// The webhook deliveries, in the webhook package's tables, where
		// the sender records them and the console reads them: 100
		// merchants' endpoints (id = merchant id, as app migration 00034
		// makes them), a message per payment, its delivery and attempt.
		{fmt.Sprintf("webhook_endpoint_deliveries: %d rows, one attempt each", payments), fmt.Sprintf(`
			INSERT INTO webhook_endpoints (id, account_id, url, secret)
			SELECT md5('merchant' || m)::uuid, md5('merchant' || m)::uuid::text, 'https://merchant.example/hooks',
			       'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'
			FROM generate_series(0, 99) m
			ON CONFLICT (id) DO NOTHING;
			INSERT INTO webhook_messages (id, account_id, event_type, occurred_at, payload)
			SELECT %[1]s, md5('merchant' || p %% 100)::uuid::text, 'payment.paid', now(), convert_to('{}', 'UTF8')
			FROM generate_series(0, %[2]d) p;
			WITH d AS (
				INSERT INTO webhook_endpoint_deliveries (message_id, endpoint_id, status, attempts, last_error, settled_at)
				SELECT %[1]s, md5('merchant' || p %% 100)::uuid,
				       CASE WHEN p %% 500 = 0 THEN 'failed' WHEN p %% 100 = 1 THEN 'pending' ELSE 'delivered' END, 1,
				       CASE WHEN p %% 500 = 0 THEN 'status 500' END, CASE WHEN p %% 100 <> 1 THEN now() END
				FROM generate_series(0, %[2]d) p
				RETURNING id, endpoint_id)
			INSERT INTO webhook_endpoint_attempts (delivery_id, endpoint_id, status_code, latency_ms)
			SELECT id, endpoint_id, 204, 12.5 FROM d`,
			msg("(p * 4 + 1)"), payments-1)},
		// Every row published but the long-lived aggregate's newest 10
		// (the newest rows): the cursors just below them.
		{"outbox_partitions", `INSERT INTO outbox_partitions (partition, owner, lease_until, published_total,
			                                published_through, published_high, published_through_at)
			SELECT g, 'forwarder-' || g, now() + interval '10 s', 1000 * g, c.id, c.id, now()
			FROM generate_series(0, 3) g, (SELECT max(id) - 10 AS id FROM outbox) c
			ON CONFLICT (partition) DO UPDATE SET owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until,
			       published_through = EXCLUDED.published_through, published_high = EXCLUDED.published_high,
			       published_through_at = EXCLUDED.published_through_at`},
		{"outbox_partition_sets", `INSERT INTO outbox_partition_sets (first_id, base, count) VALUES (0, 0, 4) ON CONFLICT DO NOTHING`},
		{"rebuild processed_messages' indexes", `DO $$ BEGIN
			EXECUTE 'ALTER TABLE processed_messages ADD CONSTRAINT processed_messages_pkey PRIMARY KEY (message_id, consumer)';
			EXECUTE 'CREATE INDEX processed_messages_processed_at_idx ON processed_messages (processed_at)';
		END $$`},
		{"VACUUM ANALYZE the seeded tables", `VACUUM ANALYZE outbox, outbox_failures, processed_messages, dead_letters,
			webhook_messages, webhook_endpoint_deliveries, webhook_endpoint_attempts, outbox_partitions`},
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET maintenance_work_mem = '256MB'`); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "| seeding step | took |\n| --- | ---: |\n")
	total := time.Now()
	for _, s := range steps {
		start := time.Now()
		if _, err := conn.Exec(ctx, s.sql); err != nil {
			return nil, fmt.Errorf("seed %s: %w", s.name, err)
		}
		fmt.Fprintf(out, "| %s | %s |\n", s.name, time.Since(start).Round(10*time.Millisecond))
	}
	fmt.Fprintf(out, "| total | %s |\n\n", time.Since(total).Round(10*time.Millisecond))
	if err := settleVisibility(ctx, conn.Conn(), out); err != nil {
		return nil, err
	}
	return consumers, nil
}

// settleVisibility VACUUMs the tables the overview counts until every page
// of them is marked all-visible, and prints how far it got. The overview's
// counts are index-only scans (open dead letters, pending webhooks), which
// skip the row only on a page the visibility map marks all-visible; in
// service, autovacuum keeps the map so on tables that change slowly. Here
// VACUUM can mark a page only once no transaction of the database that
// started before the seeding is running, and other processes' tests may
// share the database: the seeding's VACUUM ANALYZE alone may leave the map
// empty, and the counts would then visit every row, which is not the state
// of a database in service.
func settleVisibility(ctx context.Context, conn *pgx.Conn, out io.Writer) error {
	const tables = `outbox, dead_letters, webhook_endpoint_deliveries`
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var visible, pages int64
		if err := conn.QueryRow(ctx, `SELECT coalesce(sum(relallvisible), 0), coalesce(sum(relpages), 0) FROM pg_class
			WHERE oid IN ('outbox'::regclass, 'dead_letters'::regclass,
			              'webhook_endpoint_deliveries'::regclass)`).Scan(&visible, &pages); err != nil {
			return fmt.Errorf("read the visibility map's coverage: %w", err)
		}
		if visible >= pages || time.Now().After(deadline) {
			fmt.Fprintf(out, "Pages of %s marked all-visible after VACUUM: %d of %d.\n\n", tables, visible, pages)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second): // an older transaction elsewhere is still running
		}
		if _, err := conn.Exec(ctx, `VACUUM `+tables); err != nil {
			return fmt.Errorf("vacuum: %w", err)
		}
	}
}
