// Package demo drives the payments API with a realistic mix of commands and
// reports what reached the outbox: the main job of `make demo`.
package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/internal/poll"
)

// Config configures a demo run.
type Config struct {
	// APIURL is the payments API. Defaults to http://127.0.0.1:8080.
	APIURL string
	// Payments is how many payments to create. Defaults to 300.
	Payments int
	// Concurrency is how many clients drive the API. Defaults to 8.
	Concurrency int
	// APIKey is an admin key of the API (`outflow apikey create --admin`):
	// it creates the demo's merchant, whose own key, from the creation's
	// response, then drives the payments. Required.
	APIKey string
	// Pool reads the outbox for the report. Required.
	Pool *pgxpool.Pool
	// Out receives the progress and the report.
	Out io.Writer
	// ForwardTimeout is how long to wait for a forwarder to publish the
	// run's events. Zero skips the wait.
	ForwardTimeout time.Duration
	// Consumers waits for the workers and verifies their effects.
	Consumers bool
	// Rate paces the load at this many payments per second, so that it
	// lasts long enough for something to happen during it (the chaos
	// demo kills processes mid-run). Zero drives as fast as the API goes.
	Rate float64
}

// Run drives the API and prints the report. It returns an error when the
// outbox does not hold exactly the events the API acknowledged.
func Run(ctx context.Context, cfg Config) error {
	if cfg.APIURL == "" {
		cfg.APIURL = "http://127.0.0.1:8080"
	}
	if cfg.Payments <= 0 {
		cfg.Payments = 300
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 8
	}
	if cfg.APIKey == "" {
		return errors.New("demo: an admin API key is required (outflow apikey create --admin)")
	}
	c := &client{base: cfg.APIURL, key: cfg.APIKey, http: &http.Client{Timeout: 10 * time.Second}, times: &requestTimes{}}

	var since time.Time
	if err := cfg.Pool.QueryRow(ctx, `SELECT now()`).Scan(&since); err != nil {
		return fmt.Errorf("read database clock: %w", err)
	}

	rcv, err := startReceiver()
	if err != nil {
		return fmt.Errorf("start the webhook receiver: %w", err)
	}
	defer rcv.close()
	var merchant struct {
		ID     string `json:"id"`
		Secret string `json:"webhook_secret"`
		APIKey string `json:"api_key"`
	}
	if err := c.post(ctx, "/v1/merchants", map[string]string{
		"name": "Demo Coffee " + uuid.NewString()[:8], "webhook_url": rcv.url,
	}, &merchant); err != nil {
		// The receiver is plain http on 127.0.0.1: the API must run with
		// --webhook-allow-private (scripts/demo.sh sets it).
		return fmt.Errorf("create merchant (its webhook receiver is %s: the API and the worker need WEBHOOK_ALLOW_PRIVATE=true): %w",
			rcv.url, err)
	}
	rcv.mu.Lock()
	rcv.secret = merchant.Secret
	rcv.mu.Unlock()
	// From here on the demo is the merchant, as an integration would be.
	c = c.as(merchant.APIKey)

	start := time.Now()
	stopProgress := progress(ctx, cfg, since)
	defer stopProgress()
	var (
		wg       sync.WaitGroup
		next     atomic.Int64
		acked    atomic.Int64 // events the API acknowledged
		failures atomic.Int64
		firstErr error
		errOnce  sync.Once
	)
	var pace <-chan time.Time // nil: unpaced
	if cfg.Rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / cfg.Rate))
		defer t.Stop()
		pace = t.C
	}
	currencies := []string{"EUR", "USD", "BRL", "GBP"}
	for range cfg.Concurrency {
		wg.Go(func() {
			for {
				i := int(next.Add(1))
				if i > cfg.Payments || ctx.Err() != nil {
					return
				}
				if pace != nil {
					select {
					case <-pace:
					case <-ctx.Done():
						return
					}
				}
				n, err := onePayment(ctx, c, merchant.ID, currencies[i%len(currencies)], i)
				acked.Add(int64(n))
				if err != nil {
					failures.Add(1)
					errOnce.Do(func() { firstErr = err })
				}
				if i%100 == 0 {
					fmt.Fprintf(cfg.Out, "  %d/%d payments driven, %d events acknowledged\n", i, cfg.Payments, acked.Load())
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		stopProgress()
		return fmt.Errorf("%d payments failed; first: %w", failures.Load(), firstErr)
	}
	fmt.Fprintf(cfg.Out, "drove %d payments (%d events) in %s: %.0f commands/s\n",
		cfg.Payments, acked.Load(), elapsed.Round(time.Millisecond), float64(acked.Load())/elapsed.Seconds())
	// One deadline for every wait below. The progress line keeps running
	// while the pipeline drains (after a chaos run that can take a while),
	// and stops before the report so the two do not interleave.
	deadline := time.Now().Add(cfg.ForwardTimeout)
	if err := waitDrained(ctx, cfg, since, deadline, rcv); err != nil {
		stopProgress()
		return err
	}
	stopProgress()
	if err := report(ctx, cfg, since, deadline, acked.Load(), merchant.ID, c, rcv); err != nil {
		return err
	}
	return reportLatency(ctx, cfg, since, c.times)
}

// onePayment creates a payment and moves it through a random path. It
// returns how many events the API acknowledged.
func onePayment(ctx context.Context, c *client, merchantID, currency string, i int) (int, error) {
	var p struct {
		ID string `json:"id"`
	}
	amount := 100 + rand.Int64N(100_000)
	if err := c.post(ctx, "/v1/payments", map[string]any{"merchant_id": merchantID, "amount": amount, "currency": currency}, &p); err != nil {
		return 0, err
	}
	n := 1
	switch r := rand.IntN(10); {
	case r == 0: // abandoned checkout
		if err := c.post(ctx, "/v1/payments/"+p.ID+"/cancel", nil, nil); err != nil {
			return n, err
		}
		return n + 1, nil
	case r == 1: // still pending
		return n, nil
	default:
		// Retried with the same key, as a client would after a timeout: the
		// second call replays the first and writes no second event.
		key := fmt.Sprintf("demo-pay-%s", p.ID)
		for range 2 {
			if err := c.postKey(ctx, "/v1/payments/"+p.ID+"/pay", nil, nil, key); err != nil {
				return n, err
			}
		}
		n++
		if r >= 7 { // a partial then a full refund
			if err := c.post(ctx, "/v1/payments/"+p.ID+"/refund", map[string]any{"amount": amount / 2}, nil); err != nil {
				return n, err
			}
			if err := c.post(ctx, "/v1/payments/"+p.ID+"/refund", nil, nil); err != nil {
				return n + 1, err
			}
			n += 2
		}
	}
	return n, nil
}

func report(ctx context.Context, cfg Config, since, deadline time.Time, acked int64, merchantID string, c *client, rcv *receiver) error {
	out := cfg.Out
	rows, err := cfg.Pool.Query(ctx, `
		SELECT event_type, count(*) FROM outbox WHERE created_at >= $1 GROUP BY event_type ORDER BY event_type`, since)
	if err != nil {
		return fmt.Errorf("read outbox: %w", err)
	}
	defer rows.Close()
	fmt.Fprintln(out, "\noutbox rows written by this run:")
	var total int64
	for rows.Next() {
		var typ string
		var n int64
		if err := rows.Scan(&typ, &n); err != nil {
			return err
		}
		total += n
		fmt.Fprintf(out, "  %-18s %6d\n", typ, n)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	fmt.Fprintf(out, "  %-18s %6d (the API acknowledged %d)\n", "total", total, acked)

	// Every payment's events must be versions 1..N without gap or repeat.
	var aggregates, broken int64
	err = cfg.Pool.QueryRow(ctx, `
		SELECT count(*), count(*) FILTER (WHERE max_v <> n OR min_v <> 1)
		FROM (SELECT aggregate_id, min(aggregate_version) AS min_v, max(aggregate_version) AS max_v, count(*) AS n
		      FROM outbox WHERE created_at >= $1 GROUP BY aggregate_id) a`, since).Scan(&aggregates, &broken)
	if err != nil {
		return fmt.Errorf("check versions: %w", err)
	}
	fmt.Fprintf(out, "  %d payments, %d with a gap or repeat in their versions\n", aggregates, broken)

	var sample []byte
	err = cfg.Pool.QueryRow(ctx, `
		SELECT jsonb_build_object('id', id, 'message_id', message_id, 'topic', topic, 'event_type', event_type,
		       'aggregate_id', aggregate_id, 'aggregate_version', aggregate_version, 'payload', payload,
		       'metadata', metadata)
		FROM outbox WHERE created_at >= $1 AND event_type = 'payment.refunded' ORDER BY id DESC LIMIT 1`, since).Scan(&sample)
	if err == nil {
		var pretty bytes.Buffer
		_ = json.Indent(&pretty, sample, "  ", "  ")
		fmt.Fprintf(out, "\na row, as the forwarder will see it:\n  %s\n", pretty.String())
	}
	if total != acked || broken != 0 {
		return fmt.Errorf("outbox holds %d events for %d acknowledged, %d payments with broken versions", total, acked, broken)
	}
	fmt.Fprintln(out, "\nOK: every acknowledged command left exactly one event, versions gapless.")
	if err := waitForwarded(ctx, cfg, since, deadline, total); err != nil {
		return err
	}
	if !cfg.Consumers {
		return nil
	}
	return verifyConsumers(ctx, cfg, c, merchantID, since, deadline, rcv)
}

// waitForwarded waits for the forwarder to publish this run's rows, when
// one runs, and reports how long the last ones took, at most: a row is seen
// published (outbox_state) once its partition's cursor passed it, which the
// forwarder records at its lease ticks, and published_by is when the
// cursor moved, an upper bound of the publish time.
func waitForwarded(ctx context.Context, cfg Config, since, deadline time.Time, total int64) error {
	var pending, parked int64
	var lagMs float64
	err := poll.Until(ctx, 100*time.Millisecond, time.Until(deadline), func() (bool, error) {
		err := cfg.Pool.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE NOT s.published AND s.parked_at IS NULL),
			       count(*) FILTER (WHERE s.parked_at IS NOT NULL),
			       coalesce(extract(epoch FROM max(s.published_by - o.created_at)) * 1000, 0)::float8
			FROM outbox o JOIN outbox_state s USING (id) WHERE o.created_at >= $1`, since).Scan(&pending, &parked, &lagMs)
		if err != nil {
			return false, fmt.Errorf("read forwarding progress: %w", err)
		}
		return pending == 0, nil
	})
	switch {
	case err == nil:
		fmt.Fprintf(cfg.Out, "forwarded: all %d events are on the broker (%d parked); slowest commit-to-published at most %.0f ms (the cursor's tick)\n", total, parked, lagMs)
	case errors.Is(err, poll.ErrTimeout):
		fmt.Fprintf(cfg.Out, "forwarded: %d of %d events still pending (is a forwarder running? `outflow forward`)\n", pending, total)
	default:
		return err
	}
	return nil
}

type client struct {
	base  string
	key   string // sent as Authorization: Bearer
	http  *http.Client
	times *requestTimes // every POST's duration, for the latency report
}

// as returns a client that sends key.
func (c *client) as(key string) *client {
	cp := *c
	cp.key = key
	return &cp
}

// maxRateLimited bounds the retries of a request the API rate-limited.
const maxRateLimited = 20

// do sends req, made afresh by newReq for each try, and waits out a 429 as
// its Retry-After says: a limited request did nothing, so sending it again
// is safe.
func (c *client) do(ctx context.Context, newReq func() (*http.Request, error)) (*http.Response, error) {
	for try := 0; ; try++ {
		req, err := newReq()
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+c.key)
		resp, err := c.http.Do(req)
		if err != nil || resp.StatusCode != http.StatusTooManyRequests || try == maxRateLimited {
			return resp, err
		}
		resp.Body.Close()
		wait := time.Second
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			wait = time.Duration(s) * time.Second
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (c *client) post(ctx context.Context, path string, body, out any) error {
	return c.postKey(ctx, path, body, out, "")
}

func (c *client) postKey(ctx context.Context, path string, body, out any, key string) error {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return err
		}
	}
	began := time.Now()
	resp, err := c.do(ctx, func() (*http.Request, error) {
		var r io.Reader = http.NoBody
		if b != nil {
			r = bytes.NewReader(b)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, r)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		return req, nil
	})
	if err != nil {
		return fmt.Errorf("POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	c.times.add(time.Since(began))
	if err != nil {
		return fmt.Errorf("POST %s: read response: %w", path, err)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s: %s", path, resp.Status, bytes.TrimSpace(data))
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}
