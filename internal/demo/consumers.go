package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/handlers"
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
	want, err := handlers.Sign(r.secret, req.Header.Get("webhook-id"), req.Header.Get("webhook-timestamp"), body)
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

func (r *receiver) close() { _ = r.srv.Close() }

// verifyConsumers waits for the workers and checks their effects: the
// analytics projection equals the sums of the API's payments, and the
// merchant received exactly the paid and refunded events' ids.
func verifyConsumers(ctx context.Context, cfg Config, c *client, merchantID string, since time.Time, rcv *receiver) error {
	out := cfg.Out
	rows, err := cfg.Pool.Query(ctx, `
		SELECT currency, count(*) FILTER (WHERE status <> 'pending' AND status <> 'canceled'),
		       coalesce(sum(amount) FILTER (WHERE status <> 'pending' AND status <> 'canceled'), 0)::bigint,
		       coalesce(sum(refunded_amount), 0)::bigint
		FROM payments WHERE merchant_id = $1 GROUP BY currency ORDER BY currency`, merchantID)
	if err != nil {
		return err
	}
	var want []app.CurrencyStats
	for rows.Next() {
		var s app.CurrencyStats
		if err := rows.Scan(&s.Currency, &s.PaidCount, &s.PaidAmount, &s.RefundedAmount); err != nil {
			return err
		}
		want = append(want, s)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var events int
	if err := cfg.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE created_at >= $1
		AND event_type IN ('payment.paid', 'payment.refunded')`, since).Scan(&events); err != nil {
		return err
	}

	deadline := time.Now().Add(cfg.ForwardTimeout)
	var got app.MerchantStats
	for {
		got = app.MerchantStats{}
		if err := c.get(ctx, "/v1/merchants/"+merchantID+"/stats", &got); err != nil {
			return err
		}
		ids, _, _ := rcv.counts()
		if slices.Equal(got.ByCurrency, want) && ids == events {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(out, "consumers: not caught up after %s (is a worker running? `outflow worker`)\n", cfg.ForwardTimeout)
			fmt.Fprintf(out, "  analytics: %+v\n  expected:  %+v\n  webhooks: %d ids of %d events\n", got.ByCurrency, want, ids, events)
			return fmt.Errorf("consumers did not catch up")
		}
		time.Sleep(100 * time.Millisecond)
	}
	ids, deliveries, bad := rcv.counts()
	fmt.Fprintln(out, "\nconsumers:")
	for _, s := range got.ByCurrency {
		fmt.Fprintf(out, "  sync-analytics  %s: paid %d payments, %d paid, %d refunded (equal to the API's payments)\n",
			s.Currency, s.PaidCount, s.PaidAmount, s.RefundedAmount)
	}
	fmt.Fprintf(out, "  notify-merchant: %d webhook ids received for %d paid/refunded events, %d deliveries (%d duplicates), %d bad signatures\n",
		ids, events, deliveries, deliveries-ids, bad)
	if bad > 0 {
		return fmt.Errorf("%d webhooks failed signature verification", bad)
	}
	fmt.Fprintln(out, "OK: every event delivered; each handler's effect exactly once.")
	return nil
}

func (c *client) get(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
