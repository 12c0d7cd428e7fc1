package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/internal/poll"
	"github.com/outflow-dev/outflow/webhooks/signing"
)

// receiver is the demo merchant's webhook endpoint: it verifies every
// delivery's Standard Webhooks signature and counts deliveries per id.
type receiver struct {
	url    string
	srv    *http.Server
	mu     sync.Mutex
	secret string
	ids    map[string]int
	bad    int
}

func startReceiver() (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{url: "http://" + ln.Addr().String() + "/webhooks", ids: make(map[string]int)}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	want, err := signing.Sign(r.secret, req.Header.Get("webhook-id"), req.Header.Get("webhook-timestamp"), body)
	if err != nil || want != req.Header.Get("webhook-signature") {
		r.bad++
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	r.ids[req.Header.Get("webhook-id")]++
	w.WriteHeader(http.StatusNoContent)
}

func (r *receiver) counts() (ids, deliveries, bad int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.ids {
		deliveries += n
	}
	return len(r.ids), deliveries, r.bad
}

// compare returns how many of want the merchant has not received, and how
// many ids it received that are not in want.
func (r *receiver) compare(want map[string]bool) (missing, unexpected int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range want {
		if r.ids[id] == 0 {
			missing++
		}
	}
	for id := range r.ids {
		if !want[id] {
			unexpected++
		}
	}
	return missing, unexpected
}

func (r *receiver) close() { _ = r.srv.Close() }

// verifyConsumers waits for the workers and checks their effects: both
// consumers processed every event of the run, the analytics projection
// equals the sums of the API's payments, and the merchant received exactly
// the paid and refunded events' ids (a delivery twice is allowed and
// counted: webhooks are at-least-once).
func verifyConsumers(ctx context.Context, cfg Config, c *client, merchantID string, since, deadline time.Time, rcv *receiver) error {
	out := cfg.Out
	want, err := apiSums(ctx, cfg, merchantID)
	if err != nil {
		return err
	}
	webhookIDs := make(map[string]bool)
	rows, err := cfg.Pool.Query(ctx, `SELECT message_id::text FROM outbox WHERE created_at >= $1
		AND event_type IN ('payment.paid', 'payment.refunded')`, since)
	if err != nil {
		return fmt.Errorf("read the run's webhook events: %w", err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return fmt.Errorf("read the run's webhook events: %w", err)
		}
		webhookIDs[id] = true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the run's webhook events: %w", err)
	}

	var (
		got                 app.MerchantStats
		pc                  counts
		missing, unexpected int
	)
	err = poll.Until(ctx, 100*time.Millisecond, time.Until(deadline), func() (bool, error) {
		got = app.MerchantStats{}
		if err := c.get(ctx, "/v1/merchants/"+merchantID+"/stats", &got); err != nil {
			return false, err
		}
		if pc, err = readCounts(ctx, cfg, since); err != nil {
			return false, err
		}
		missing, unexpected = rcv.compare(webhookIDs)
		// The projection only ever grows: above the API's sums it stays
		// above, so an effect applied twice fails now, not at the deadline.
		if exceeds(got.ByCurrency, want) {
			fmt.Fprintf(out, "  analytics: %+v\n  expected:  %+v\n", got.ByCurrency, want)
			return false, fmt.Errorf("the analytics projection exceeds the API's payments: an effect was applied twice")
		}
		if unexpected > 0 {
			return false, fmt.Errorf("the merchant received %d webhook ids that are no paid or refunded event of this run", unexpected)
		}
		return slices.Equal(got.ByCurrency, want) && missing == 0 && pc.analytics == pc.written && pc.notify == pc.written, nil
	})
	if errors.Is(err, poll.ErrTimeout) {
		fmt.Fprintf(out, "consumers: not caught up after %s (is a worker running? `outflow worker`)\n", cfg.ForwardTimeout)
		fmt.Fprintf(out, "  analytics: %+v\n  expected:  %+v\n", got.ByCurrency, want)
		fmt.Fprintf(out, "  processed: sync-analytics %d, notify-merchant %d of %d events; webhooks: %d of %d ids missing\n",
			pc.analytics, pc.notify, pc.written, missing, len(webhookIDs))
		return fmt.Errorf("consumers did not catch up")
	}
	if err != nil {
		return err
	}
	ids, deliveries, bad := rcv.counts()
	fmt.Fprintln(out, "\nconsumers:")
	fmt.Fprintf(out, "  processed once each: sync-analytics %d, notify-merchant %d, of %d events\n", pc.analytics, pc.notify, pc.written)
	for _, s := range got.ByCurrency {
		fmt.Fprintf(out, "  sync-analytics  %s: paid %d payments, %s paid, %s refunded (equal to the API's payments)\n",
			s.Currency, s.PaidCount, s.PaidAmount, s.RefundedAmount)
	}
	fmt.Fprintf(out, "  notify-merchant: %d webhook ids received for %d paid/refunded events, %d deliveries (%d duplicates), %d bad signatures\n",
		ids, len(webhookIDs), deliveries, deliveries-ids, bad)
	if bad > 0 {
		return fmt.Errorf("%d webhooks failed signature verification", bad)
	}
	fmt.Fprintln(out, "OK: every event delivered; each handler's effect exactly once.")
	return nil
}

// apiSums is what the analytics projection must show for the merchant: the
// sums of its payments, per currency, as the API's own tables hold them.
func apiSums(ctx context.Context, cfg Config, merchantID string) ([]app.CurrencyStats, error) {
	rows, err := cfg.Pool.Query(ctx, `
		SELECT currency, count(*) FILTER (WHERE status <> 'pending' AND status <> 'canceled'),
		       coalesce(sum(amount) FILTER (WHERE status <> 'pending' AND status <> 'canceled'), 0),
		       coalesce(sum(refunded_amount), 0)
		FROM payments WHERE merchant_id = $1 GROUP BY currency ORDER BY currency`, merchantID)
	if err != nil {
		return nil, fmt.Errorf("sum the API's payments: %w", err)
	}
	var want []app.CurrencyStats
	for rows.Next() {
		var s app.CurrencyStats
		if err := rows.Scan(&s.Currency, &s.PaidCount, &s.PaidAmount, &s.RefundedAmount); err != nil {
			return nil, fmt.Errorf("sum the API's payments: %w", err)
		}
		want = append(want, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sum the API's payments: %w", err)
	}
	return want, nil
}

// exceeds reports whether any currency of got is above want, or absent from
// want: more than the payments add up to.
func exceeds(got, want []app.CurrencyStats) bool {
	for _, g := range got {
		i := slices.IndexFunc(want, func(w app.CurrencyStats) bool { return w.Currency == g.Currency })
		if i < 0 {
			return true
		}
		w := want[i]
		if g.PaidCount > w.PaidCount || g.PaidAmount.Cmp(w.PaidAmount) > 0 || g.RefundedAmount.Cmp(w.RefundedAmount) > 0 {
			return true
		}
	}
	return false
}

func (c *client) get(ctx context.Context, path string, out any) error {
	resp, err := c.do(ctx, func() (*http.Request, error) {
		return http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	})
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
