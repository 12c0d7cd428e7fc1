package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/internal/poll"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/fanout"
	"github.com/outflow-dev/outflow/webhooks/schema"
	"github.com/outflow-dev/outflow/webhooks/sender"
)

// WebhooksScaleConfig configures the webhooks package's scale benchmark.
type WebhooksScaleConfig struct {
	DatabaseURL string
	// Accounts each have EndpointsPerAccount endpoints (no event-type
	// filter): every event is one delivery per endpoint of its account.
	Accounts            int
	EndpointsPerAccount int
	// Rate is the events offered per second, each to a random account,
	// for Duration, in 10 ms ticks; a tick's events share transactions of
	// at most PerTx, as the consumer's shared transaction of a batch does
	// (at 200 events/s, 2 a transaction; from 1,000/s, PerTx).
	Rate     int
	Duration time.Duration
	PerTx    int
	// Producers commit those transactions at once, so that a slow commit
	// does not lower the rate offered.
	Producers int
	// Failing is the fraction of endpoints that do not answer well in the
	// second run: half of them answer 500 at once, half after SlowDelay
	// (past the Sender's Timeout, so they time out).
	Failing   float64
	SlowDelay time.Duration
	// Drain bounds the wait, after the offer ends, for the healthy
	// endpoints' deliveries still on their way.
	Drain time.Duration
	// Sender is the Sender's configuration (Concurrency, PerEndpoint,
	// SuspectConcurrency, Timeout: made explicit by the caller).
	Sender sender.Config
	Out    io.Writer
}

// WebhooksScale measures the webhooks package at scale: handled (the
// commit of the transaction that recorded an event's deliveries with
// fanout.Enqueue, then the Sender's Wake, as the consumer handler does) to
// delivered (the receiver got the request), for the healthy endpoints,
// and their deliveries per second. Two runs in one process, each in a
// schema of its own: every endpoint healthy (the baseline), then a
// fraction failing or slow; the ratios of the healthy endpoints' p99 and
// throughput, failing run over baseline, are the result.
func WebhooksScale(ctx context.Context, cfg WebhooksScaleConfig) error {
	out := cfg.Out
	sc := cfg.Sender
	fmt.Fprintf(out, "webhooks-scale: %d accounts x %d endpoints, %d events/s offered for %s (at most %d per transaction), "+
		"sender Concurrency %d, PerEndpoint %d, SuspectConcurrency %d, Timeout %s; handled (commit) -> receiver got it\n\n",
		cfg.Accounts, cfg.EndpointsPerAccount, cfg.Rate, cfg.Duration, cfg.PerTx,
		sc.Concurrency, sc.PerEndpoint, sc.SuspectConcurrency, sc.Timeout)
	base, err := scaleRun(ctx, cfg, 0)
	if err != nil {
		return fmt.Errorf("all healthy: %w", err)
	}
	bad, err := scaleRun(ctx, cfg, cfg.Failing)
	if err != nil {
		return fmt.Errorf("%.0f%% failing: %w", cfg.Failing*100, err)
	}
	fmt.Fprintf(out, "| run | events offered/s | healthy deliveries | delivered | p50 ms | p99 ms | max ms | healthy offered/s | healthy delivered/s | failing endpoints' attempts | pending at end |\n")
	fmt.Fprintf(out, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range []struct {
		name string
		res  scaleResult
	}{{"all healthy", base}, {fmt.Sprintf("%.0f%% failing or slow", cfg.Failing*100), bad}} {
		fmt.Fprintf(out, "| %s | %.0f | %d | %d | %.1f | %.1f | %.1f | %.0f | %.0f | %d | %d |\n", r.name, r.res.offered,
			r.res.recorded, r.res.delivered, ms(r.res.p50), ms(r.res.p99), ms(r.res.max),
			float64(r.res.recorded)/cfg.Duration.Seconds(), r.res.perSec, r.res.badAttempts, r.res.pendingAtEnd)
	}
	fmt.Fprintf(out, "\n| run | due index scans | entries read per scan | most due deliveries waiting (sampled every 250 ms) |\n| --- | ---: | ---: | ---: |\n")
	for _, r := range []struct {
		name string
		res  scaleResult
	}{{"all healthy", base}, {"failing", bad}} {
		fmt.Fprintf(out, "| %s | %d | %.0f | %d |\n", r.name, r.res.dueScans,
			float64(r.res.dueRead)/float64(max(r.res.dueScans, 1)), r.res.maxDue)
	}
	fmt.Fprintf(out, "\nstatements, all healthy:\n\n")
	base.stats.print(out, base.elapsed)
	fmt.Fprintf(out, "\nstatements, failing run:\n\n")
	bad.stats.print(out, bad.elapsed)
	p99Ratio := float64(bad.p99) / float64(max(base.p99, time.Microsecond))
	tputRatio := bad.perSec / max(base.perSec, 1e-9)
	fmt.Fprintf(out, "\nhealthy endpoints, failing run vs all-healthy run: p99 %.2fx, throughput %.2fx\n", p99Ratio, tputRatio)
	if o := bad.offered / max(base.offered, 1e-9); o < 0.95 || o > 1.05 {
		fmt.Fprintf(out, "(the runs were offered different rates, %.0f and %.0f events/s: the producers could not keep the rate, "+
			"so the throughput ratio compares unequal loads)\n", base.offered, bad.offered)
	}
	fmt.Fprintf(out, "target: healthy p99 under 100 ms (all healthy: %s, failing run: %s); throughput kept (ratio >= 0.95: %s)\n",
		verdictText(base.p99 < 100*time.Millisecond && base.delivered == base.recorded),
		verdictText(bad.p99 < 100*time.Millisecond && bad.delivered == bad.recorded), verdictText(tputRatio >= 0.95))
	return nil
}

type scaleResult struct {
	offered             float64       // events committed per second
	recorded, delivered int           // deliveries to the measured endpoints (healthy in both runs)
	p50, p99, max       time.Duration // an undelivered one counts with its wait so far
	perSec              float64       // healthy deliveries received per second during the offer
	badAttempts         int           // requests the failing and slow endpoints received
	pendingAtEnd        int           // deliveries pending when the run ended (the failing endpoints' backlog)
	dueScans, dueRead   int64         // scans of the due index, entries they read
	maxDue              int           // most due deliveries seen waiting during the offer (sampled)
	stats               *stmtStats
	elapsed             time.Duration
}

// scaleReceiver is every endpoint: /ok/<n> answers 204 at once and notes
// when it got each webhook, /fail/<n> answers 500, /slow/<n> answers after
// slow (or when the Sender gives up).
type scaleReceiver struct {
	*httptest.Server
	slow time.Duration
	mu   sync.Mutex
	got  map[string]time.Time // webhook-id + "/" + endpoint number
	bad  int
}

func newScaleReceiver(slow time.Duration) *scaleReceiver {
	r := &scaleReceiver{slow: slow, got: map[string]time.Time{}}
	r.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		now := time.Now()
		_, _ = io.Copy(io.Discard, req.Body)
		kind, n, _ := strings.Cut(strings.TrimPrefix(req.URL.Path, "/"), "/")
		switch kind {
		case "ok":
			key := req.Header.Get("webhook-id") + "/" + n
			r.mu.Lock()
			if _, ok := r.got[key]; !ok {
				r.got[key] = now
			}
			r.mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		case "fail":
			r.mu.Lock()
			r.bad++
			r.mu.Unlock()
			w.WriteHeader(http.StatusInternalServerError)
		default:
			r.mu.Lock()
			r.bad++
			r.mu.Unlock()
			t := time.NewTimer(r.slow)
			defer t.Stop()
			select {
			case <-t.C:
				w.WriteHeader(http.StatusNoContent)
			case <-req.Context().Done():
			}
		}
	}))
	// Many connections at once from one client: keep-alives on, no limit.
	r.Server.Start()
	return r
}

func (r *scaleReceiver) at(key string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.got[key]
	return t, ok
}

// expected is a healthy delivery to wait for: its receiver key and the
// commit of the transaction that recorded it.
type expected struct {
	key string
	at  time.Time
}

// scaleRun is one run: fresh schema, endpoints, receiver and Sender;
// failing is the fraction of endpoints that fail (0: all healthy, and
// the sample that fails in the other run is not measured).
func scaleRun(ctx context.Context, cfg WebhooksScaleConfig, failing float64) (scaleResult, error) {
	stats := newStmtStats(webhookStatement)
	pool, drop, err := SchemaSets(ctx, cfg.DatabaseURL, 24, stats, schema.Set())
	if err != nil {
		return scaleResult{}, err
	}
	defer drop()
	rcv := newScaleReceiver(cfg.SlowDelay)
	defer rcv.Close()

	nEndpoints := cfg.Accounts * cfg.EndpointsPerAccount
	// Which endpoints misbehave in the failing run: the same sample in
	// both runs (half of it answering 500, half slow), left out of the
	// measure in both, so that the ratios compare the same endpoints. In
	// the all-healthy run they answer as the others do.
	rng := rand.New(rand.NewPCG(27, 27))
	kind := make([]string, nEndpoints)
	measured := make([]bool, nEndpoints)
	for i := range kind {
		kind[i], measured[i] = "ok", true
	}
	nBad := int(cfg.Failing*float64(nEndpoints) + 0.5)
	for j, i := range rng.Perm(nEndpoints)[:nBad] {
		measured[i] = false
		if failing > 0 {
			kind[i] = map[bool]string{true: "fail", false: "slow"}[j%2 == 0]
		}
	}
	ids := make([]string, nEndpoints)
	accounts := make([]string, nEndpoints)
	urls := make([]string, nEndpoints)
	for i := range ids {
		ids[i] = uuid.NewString()
		accounts[i] = fmt.Sprintf("acct_%06d", i/cfg.EndpointsPerAccount)
		urls[i] = rcv.URL + "/" + kind[i] + "/" + strconv.Itoa(i)
	}
	// The endpoints are inserted as rows (20,000 Creates would only time
	// the setup); every one has the same plaintext secret: signing costs
	// the same whatever the secret.
	if _, err := pool.Exec(ctx, `
		INSERT INTO webhook_endpoints (id, account_id, url, secret)
		SELECT e.id, e.account_id, e.url, $4 FROM unnest($1::uuid[], $2::text[], $3::text[]) AS e(id, account_id, url)`,
		ids, accounts, urls, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"); err != nil {
		return scaleResult{}, fmt.Errorf("insert endpoints: %w", err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE webhook_endpoints`); err != nil {
		return scaleResult{}, err
	}

	sc := cfg.Sender
	sc.AllowPrivate = true // the receiver is on 127.0.0.1
	sc.Logger = quietLogger()
	// Every endpoint is one host:port here, unlike in production: the
	// transport must keep as many idle connections to it as requests run
	// at once, or each request would open a connection.
	sc.Client = &http.Client{Transport: &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096}}
	snd, stopSender := runSender(ctx, pool, sc)
	defer stopSender()

	// Producers: transactions of PerTx events, each recorded with
	// fanout.Enqueue, then Wake once committed.
	type batch struct{ accounts []int }
	work := make(chan batch, 1024)
	var (
		mu        sync.Mutex
		want      []expected
		committed int
		prodErr   error
		wg        sync.WaitGroup
	)
	payload := func(acct int) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"payout_id":%q,"merchant_id":"acct_%06d","amount":{"minor":1250,"currency":"EUR"}}`,
			uuid.NewString(), acct))
	}
	for range cfg.Producers {
		wg.Go(func() {
			for b := range work {
				msgs := make([]webhooks.Message, len(b.accounts))
				for i, a := range b.accounts {
					msgs[i] = webhooks.Message{ID: uuid.NewString(), AccountID: fmt.Sprintf("acct_%06d", a),
						EventType: "payout.sent", OccurredAt: time.Now(), SchemaVersion: 2, Payload: payload(a)}
				}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					for _, m := range msgs {
						if _, err := fanout.Enqueue(ctx, tx, m, fanout.Target{}, ""); err != nil {
							return err
						}
					}
					return nil
				})
				now := time.Now()
				if err == nil {
					snd.Wake()
				}
				mu.Lock()
				if err != nil {
					prodErr = err
				} else {
					committed += len(msgs)
					for i, a := range b.accounts {
						for e := a * cfg.EndpointsPerAccount; e < (a+1)*cfg.EndpointsPerAccount; e++ {
							if measured[e] {
								want = append(want, expected{key: msgs[i].ID + "/" + strconv.Itoa(e), at: now})
							}
						}
					}
				}
				mu.Unlock()
			}
		})
	}
	dueSampler := sampleDue(ctx, pool)
	defer dueSampler.stop()
	stats.start()
	start := time.Now()
	err = pace(ctx, cfg.Rate, cfg.Duration, func(n int) error {
		for n > 0 {
			k := min(n, cfg.PerTx)
			b := batch{accounts: make([]int, k)}
			for i := range b.accounts {
				b.accounts[i] = rng.IntN(cfg.Accounts)
			}
			select {
			case work <- b:
			case <-ctx.Done():
				return ctx.Err()
			}
			n -= k
		}
		return nil
	})
	close(work)
	wg.Wait()
	offerEnd := time.Now()
	dueSampler.stop()
	if err != nil {
		return scaleResult{}, err
	}
	if prodErr != nil {
		return scaleResult{}, fmt.Errorf("enqueue: %w", prodErr)
	}

	res := scaleResult{offered: float64(committed) / offerEnd.Sub(start).Seconds(), recorded: len(want)}
	_ = poll.Until(ctx, 100*time.Millisecond, cfg.Drain, func() (bool, error) {
		for _, w := range want {
			if _, ok := rcv.at(w.key); !ok {
				return false, nil
			}
		}
		return true, nil
	})
	// A delivery still missing counts with its wait so far, a lower
	// bound: leaving it out would flatter the tail.
	measuredAt := time.Now()
	lat := make([]time.Duration, 0, len(want))
	inWindow := 0
	for _, w := range want {
		got, ok := rcv.at(w.key)
		if !ok {
			lat = append(lat, measuredAt.Sub(w.at))
			continue
		}
		res.delivered++
		lat = append(lat, got.Sub(w.at))
		if !got.After(start.Add(cfg.Duration)) {
			inWindow++
		}
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		res.p50, res.p99, res.max = quantile(lat, 0.5), quantile(lat, 0.99), lat[len(lat)-1]
	}
	res.perSec = float64(inWindow) / cfg.Duration.Seconds()
	res.stats = stats
	res.elapsed = time.Since(start)
	rcv.mu.Lock()
	res.badAttempts = rcv.bad
	rcv.mu.Unlock()
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoint_deliveries WHERE status = 'pending'`).
		Scan(&res.pendingAtEnd); err != nil {
		return res, err
	}
	// The work of the due scan, whatever the machine's load: the index
	// entries read per scan of the due index (the Sender's leases, almost
	// all of its scans). A backend reports its counts at most a second
	// late: the Sender is stopped and the counts read after that.
	stopSender()
	time.Sleep(1100 * time.Millisecond)
	if err := pool.QueryRow(ctx, `SELECT idx_scan, idx_tup_read FROM pg_stat_user_indexes
		WHERE schemaname = current_schema() AND indexrelname = 'webhook_endpoint_deliveries_due_healthy_idx'`).
		Scan(&res.dueScans, &res.dueRead); err != nil {
		return res, fmt.Errorf("due index stats: %w", err)
	}
	res.maxDue = dueSampler.max()
	return res, nil
}

// dueSampler counts the due deliveries not leased (what the due scan walks
// before it finds one it may lease) every 250 ms, on a connection of its
// own, until stopped.
type dueSampler struct {
	stop func() // idempotent
	done chan struct{}
	most int
}

func sampleDue(ctx context.Context, pool *pgxpool.Pool) *dueSampler {
	ctx, cancel := context.WithCancel(ctx)
	d := &dueSampler{done: make(chan struct{})}
	d.stop = sync.OnceFunc(func() { cancel(); <-d.done })
	go func() {
		defer close(d.done)
		poll.Every(ctx, 250*time.Millisecond, func(ctx context.Context) error {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoint_deliveries
				WHERE status = 'pending' AND next_attempt_at <= now()`).Scan(&n); err != nil {
				return err
			}
			d.most = max(d.most, n)
			return nil
		}, func(error) {}) // a missed sample is one fewer point of a maximum
	}()
	return d
}

func (d *dueSampler) max() int { return d.most }

// runSender runs a Sender on pool until the returned stop (idempotent),
// which returns once Run has.
func runSender(ctx context.Context, pool *pgxpool.Pool, cfg sender.Config) (*sender.Sender, func()) {
	snd := sender.New(pool, cfg)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = snd.Run(ctx) }()
	return snd, sync.OnceFunc(func() { cancel(); <-done })
}
