package bench

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/internal/poll"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/fanout"
	"github.com/outflow-dev/outflow/webhooks/sender"
)

// WebhooksConfig configures the webhook benchmark.
type WebhooksConfig struct {
	DatabaseURL string
	// Rate is the deliveries recorded per second. Duration is each run's
	// length.
	Rate     int
	Duration time.Duration
	// Merchants share the Rate; in the slow run the first answers after
	// SlowDelay.
	Merchants int
	SlowDelay time.Duration
	Out       io.Writer
}

// Webhooks measures handled -> delivered: from the commit of a webhook
// message and its delivery to the merchant's endpoint (as NotifyMerchant's
// handler records them with fanout.Enqueue, followed by the in-process
// wake the worker gives the webhook package's Sender) to the merchant's
// answer, at a steady rate,
// to a receiver answering in 1 ms. Three runs in one process:
//
//   - baseline: a plain http.Client posting to the same receiver at the
//     same rate, no database: the receiver's own round trip;
//   - all fast: the Sender, Merchants merchants answering in 1 ms;
//   - one slow: the same, the first merchant answering after SlowDelay
//     (past the Sender's 10 s timeout); measured on the others.
func Webhooks(ctx context.Context, cfg WebhooksConfig) error {
	out := cfg.Out
	fmt.Fprintf(out, "webhooks: %d deliveries/s for %s over %d merchants, receiver answering in 1 ms; handled (commit) -> merchant answered\n\n",
		cfg.Rate, cfg.Duration, cfg.Merchants)
	base, err := plainRoundTrips(ctx, cfg)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	fast, err := webhookRun(ctx, cfg, 0)
	if err != nil {
		return fmt.Errorf("all fast: %w", err)
	}
	slow, err := webhookRun(ctx, cfg, cfg.SlowDelay)
	if err != nil {
		return fmt.Errorf("one slow: %w", err)
	}
	fmt.Fprintf(out, "| run | measured | delivered | p50 ms | p99 ms | max ms | p99 vs all fast |\n| --- | --- | ---: | ---: | ---: | ---: | ---: |\n")
	fmt.Fprintf(out, "| baseline: plain client, no database | every request | %d/%d | %.1f | %.1f | %.1f | |\n",
		base.delivered, base.recorded, ms(base.p50), ms(base.p99), ms(base.max))
	fmt.Fprintf(out, "| Sender, %d merchants answering in 1 ms | every delivery | %d/%d | %.1f | %.1f | %.1f | 1.00x |\n",
		cfg.Merchants, fast.delivered, fast.recorded, ms(fast.p50), ms(fast.p99), ms(fast.max))
	fmt.Fprintf(out, "| Sender, 1 of %d merchants answering after %s | the other %d | %d/%d | %.1f | %.1f | %.1f | %.2fx |\n",
		cfg.Merchants, cfg.SlowDelay, cfg.Merchants-1, slow.delivered, slow.recorded, ms(slow.p50), ms(slow.p99), ms(slow.max),
		float64(slow.p99)/float64(max(fast.p99, 1)))
	fmt.Fprintf(out, "\ntarget: p99 under 100 ms in both Sender runs (all fast: %s; one slow, the others: %s)\n",
		verdictText(fast.p99 < 100*time.Millisecond), verdictText(slow.p99 < 100*time.Millisecond))
	return nil
}

func verdictText(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

type webhookResult struct {
	recorded, delivered int
	p50, p99, max       time.Duration
}

// receiver answers after 1 ms, or after slow on the path /slow (or when
// the sender gives up), and notes when it answered each webhook-id.
type receiver struct {
	*httptest.Server
	slow time.Duration
	mu   sync.Mutex
	at   map[string]time.Time
}

func newReceiver(slow time.Duration) *receiver {
	r := &receiver{slow: slow, at: map[string]time.Time{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body) // then a client that leaves cancels req.Context()
		wait := time.Millisecond
		if strings.HasSuffix(req.URL.Path, "/slow") {
			wait = r.slow
		}
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-req.Context().Done():
			return
		}
		w.WriteHeader(http.StatusNoContent)
		now := time.Now()
		r.mu.Lock()
		if _, ok := r.at[req.Header.Get("webhook-id")]; !ok {
			r.at[req.Header.Get("webhook-id")] = now
		}
		r.mu.Unlock()
	}))
	return r
}

func (r *receiver) answered(id string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.at[id]
	return t, ok
}

// pace calls fn(n) every 10 ms with the number of items due since the
// last call, so that rate per second are offered whatever fn's latency,
// until d has passed.
func pace(ctx context.Context, rate int, d time.Duration, fn func(n int) error) error {
	start := time.Now()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	sent := 0
	for {
		elapsed := time.Since(start)
		due := int(elapsed.Seconds()*float64(rate)) - sent
		if elapsed >= d {
			due = int(d.Seconds()*float64(rate)) - sent
		}
		if due > 0 {
			if err := fn(due); err != nil {
				return err
			}
			sent += due
		}
		if elapsed >= d {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// plainRoundTrips is the baseline: the receiver's own round trip from a
// plain client at the same rate.
func plainRoundTrips(ctx context.Context, cfg WebhooksConfig) (webhookResult, error) {
	rcv := newReceiver(0)
	defer rcv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}
	var (
		mu  sync.Mutex
		lat []time.Duration
		wg  sync.WaitGroup
		res webhookResult
	)
	err := pace(ctx, cfg.Rate, cfg.Duration, func(n int) error {
		for range n {
			res.recorded++
			wg.Go(func() {
				start := time.Now()
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, rcv.URL+"/fast", strings.NewReader(`{"type":"payment.paid"}`))
				if err != nil {
					return
				}
				req.Header.Set("webhook-id", uuid.NewString())
				resp, err := client.Do(req)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				d := time.Since(start)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			})
		}
		return nil
	})
	wg.Wait()
	if err != nil {
		return res, err
	}
	slices.Sort(lat)
	res.delivered = len(lat)
	if len(lat) > 0 {
		res.p50, res.p99, res.max = quantile(lat, 0.5), quantile(lat, 0.99), lat[len(lat)-1]
	}
	return res, nil
}

// webhookRun records deliveries at the rate, round robin over the
// merchants, each commit followed by a wake of the Sender, and measures
// the merchants that answer fast. slow > 0 makes the first merchant answer
// after it.
func webhookRun(ctx context.Context, cfg WebhooksConfig, slow time.Duration) (webhookResult, error) {
	pool, drop, err := Schema(ctx, cfg.DatabaseURL, 16)
	if err != nil {
		return webhookResult{}, err
	}
	defer drop()
	rcv := newReceiver(slow)
	defer rcv.Close()
	merchants := make([]string, cfg.Merchants)
	for i := range merchants {
		merchants[i] = uuid.NewString()
		path := "/fast"
		if i == 0 && slow > 0 {
			path = "/slow"
		}
		secret := make([]byte, 24)
		_, _ = rand.Read(secret)
		if _, err := pool.Exec(ctx, `INSERT INTO merchants (id, name, webhook_url, webhook_secret) VALUES ($1, $2, $3, $4)`,
			merchants[i], fmt.Sprint("m", i), rcv.URL+"/"+merchants[i]+path, "whsec_"+base64.StdEncoding.EncodeToString(secret)); err != nil {
			return webhookResult{}, err
		}
	}
	// The merchants are httptest servers on 127.0.0.1; each has the
	// endpoint app migration 00034's trigger made (id = merchant id).
	snd, stopSender := runSender(ctx, pool, sender.Config{Logger: quietLogger(), AllowPrivate: true})
	defer stopSender()

	committed := map[string]time.Time{}
	measured := map[string]bool{}
	next := 0
	err = pace(ctx, cfg.Rate, cfg.Duration, func(n int) error {
		ids, mids := make([]string, n), make([]string, n)
		for i := range n {
			ids[i], mids[i] = uuid.NewString(), merchants[next%len(merchants)]
			measured[ids[i]] = !(slow > 0 && next%len(merchants) == 0)
			next++
		}
		if err := recordDeliveries(ctx, pool, ids, mids); err != nil {
			return err
		}
		now := time.Now()
		snd.Wake()
		for _, id := range ids {
			committed[id] = now
		}
		return nil
	})
	if err != nil {
		return webhookResult{}, err
	}
	// Let the measured deliveries arrive (they all should, long before);
	// one that did not in 30 s is reported as not delivered.
	var (
		res webhookResult
		lat []time.Duration
	)
	_ = poll.Until(ctx, 50*time.Millisecond, 30*time.Second, func() (bool, error) {
		res, lat = webhookResult{}, nil
		for id, at := range committed {
			if !measured[id] {
				continue
			}
			res.recorded++
			if got, ok := rcv.answered(id); ok {
				lat = append(lat, got.Sub(at))
			}
		}
		res.delivered = len(lat)
		return res.delivered == res.recorded, nil
	})
	slices.Sort(lat)
	if len(lat) > 0 {
		res.p50, res.p99, res.max = quantile(lat, 0.5), quantile(lat, 0.99), lat[len(lat)-1]
	}
	return res, nil
}

// recordDeliveries commits one message per id to its merchant's
// endpoints, as NotifyMerchant's handler does inside the consumer's
// transaction (several messages may share one).
func recordDeliveries(ctx context.Context, pool *pgxpool.Pool, ids, merchants []string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		now := time.Now()
		for i, id := range ids {
			if _, err := fanout.Enqueue(ctx, tx, webhooks.Message{ID: id, AccountID: merchants[i], EventType: "payment.paid",
				OccurredAt: now, SchemaVersion: 1, Payload: []byte(`{}`)}, fanout.Target{}, ""); err != nil {
				return err
			}
		}
		return nil
	})
}
