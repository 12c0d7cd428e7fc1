package payouts_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/examples/payouts"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/endpoints"
	"github.com/outflow-dev/outflow/webhooks/schema"
	"github.com/outflow-dev/outflow/webhooks/sender"
	"github.com/outflow-dev/outflow/webhooks/signing"
)

// receiver is a merchant's webhook endpoint: it keeps what it got.
type receiver struct {
	*httptest.Server
	mu   sync.Mutex
	got  []received
	name string
}

type received struct {
	header http.Header
	body   []byte
}

func newReceiver(t *testing.T, name string) *receiver {
	r := &receiver{name: name}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.got = append(r.got, received{header: req.Header.Clone(), body: body})
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) requests() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.got...)
}

// createEndpoint creates an endpoint through the service's HTTP API, as
// the merchant whose key is given, and returns it with its secret.
func createEndpoint(t *testing.T, h http.Handler, merchant, key, body string) (endpoints.Created, int) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/merchants/"+merchant+"/webhook_endpoints", strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var c endpoints.Created
	if rec.Code == http.StatusCreated {
		if err := json.Unmarshal(rec.Body.Bytes(), &c); err != nil {
			t.Fatal(err)
		}
	}
	return c, rec.Code
}

// A merchant's endpoint keeps the payload version it was made for: one
// created while the service's API version was "v1" receives payout.sent in
// version 1's flat shape, one created since "v2" receives the money object;
// both signed with their own secret, both for the same event (one
// webhook-id), end to end: the service's command, the outbox, the fanout
// consumer, the sender, the receivers.
func TestWebhookEndpointsGetThePayloadVersionTheyWerePinnedTo(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, schema.Set(), payouts.Migrations())
	ctx := t.Context()
	w, err := outbox.NewWriter(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc := payouts.NewService(s.Pool, w, nil)

	snd := sender.New(s.Pool, sender.Config{Render: payouts.RenderWebhook, AllowPrivate: true,
		PollInterval: 50 * time.Millisecond, Timeout: 5 * time.Second})
	sctx, stop := context.WithCancel(context.Background())
	sent := make(chan error, 1)
	go func() { sent <- snd.Run(sctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-sent; err != nil {
			t.Errorf("sender: %v", err)
		}
	})
	outflowtest.StartPipeline(t, s.Pool, registry(t),
		[]consumer.Handler{payouts.Balances(), payouts.WebhookFanout(snd.Wake)})

	keys := payouts.StaticKeys(map[string]string{"key_m1": "m1", "key_m2": "m2"})
	// The service as it was deployed while its API version was "v1", and
	// as it is now: the same routes, the store pinning new endpoints to
	// the version of its day.
	handler := func(apiVersion string) http.Handler {
		store, err := endpoints.New(endpoints.Config{APIVersion: apiVersion, AllowPrivate: true})
		if err != nil {
			t.Fatal(err)
		}
		api, err := payouts.NewWebhookAPI(s.Pool, store, snd.Wake, nil)
		if err != nil {
			t.Fatal(err)
		}
		mux := svc.Handler(nil)
		payouts.MountWebhooks(mux, api, keys)
		return mux
	}
	before, now := handler("v1"), handler(payouts.APIVersion)
	oldRcv, newRcv := newReceiver(t, "v1 endpoint"), newReceiver(t, "v2 endpoint")
	old, code := createEndpoint(t, before, "m1", "key_m1", `{"url": "`+oldRcv.URL+`", "event_types": ["payout.sent"]}`)
	if code != http.StatusCreated || old.APIVersion != "v1" {
		t.Fatalf("endpoint made under v1: %d %+v", code, old.Endpoint)
	}
	cur, code := createEndpoint(t, now, "m1", "key_m1", `{"url": "`+newRcv.URL+`", "event_types": ["payout.*"]}`)
	if code != http.StatusCreated || cur.APIVersion != "v2" {
		t.Fatalf("endpoint made under v2: %d %+v", code, cur.Endpoint)
	}
	// The routes are the service's, behind its authentication: no key is
	// 401, another merchant's key is 404, as a merchant that is none.
	if _, code := createEndpoint(t, now, "m1", "", `{"url": "`+newRcv.URL+`"}`); code != http.StatusUnauthorized {
		t.Fatalf("no API key: %d, want 401", code)
	}
	if _, code := createEndpoint(t, now, "m1", "key_m2", `{"url": "`+newRcv.URL+`"}`); code != http.StatusNotFound {
		t.Fatalf("m2's key on m1: %d, want 404", code)
	}

	p, err := svc.Request(ctx, "m1", 1250, "EUR")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.MarkSent(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	// v1's endpoint wants payout.sent only; v2's every payout.* event.
	outflowtest.WaitFor(t, 30*time.Second, "the webhooks", func() bool {
		return len(oldRcv.requests()) >= 1 && len(newRcv.requests()) >= 2
	})
	sentTo := func(r *receiver, secret, otherSecret string) (string, map[string]any) {
		t.Helper()
		for _, got := range r.requests() {
			if err := signing.Verify(secret, got.header, got.body, time.Now(), 0); err != nil {
				t.Fatalf("%s: signature: %v", r.name, err)
			}
			if signing.Verify(otherSecret, got.header, got.body, time.Now(), 0) == nil {
				t.Fatalf("%s: the request verifies with another endpoint's secret", r.name)
			}
			var b struct {
				webhooks.Body
				Data map[string]any `json:"data"`
			}
			if err := json.Unmarshal(got.body, &b); err != nil {
				t.Fatalf("%s: %v: %s", r.name, err, got.body)
			}
			if b.Type == payouts.SentType {
				return got.header.Get(signing.HeaderID), b.Data
			}
		}
		t.Fatalf("%s: no payout.sent among %d requests", r.name, len(r.requests()))
		return "", nil
	}
	oldID, v1 := sentTo(oldRcv, old.Secret, cur.Secret)
	newID, v2 := sentTo(newRcv, cur.Secret, old.Secret)
	if oldID == "" || oldID != newID {
		t.Fatalf("webhook-id %q and %q: want the event's message id on both", oldID, newID)
	}
	wantV1 := map[string]any{"payout_id": p.ID, "merchant_id": "m1", "amount_minor": 1250.0, "currency": "EUR"}
	wantV2 := map[string]any{"payout_id": p.ID, "merchant_id": "m1",
		"amount": map[string]any{"minor": 1250.0, "currency": "EUR"}}
	if !jsonEqual(v1, wantV1) {
		t.Errorf("the v1 endpoint got %v, want %v", v1, wantV1)
	}
	if !jsonEqual(v2, wantV2) {
		t.Errorf("the v2 endpoint got %v, want %v", v2, wantV2)
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// The renderer converts payout.sent between its shapes both ways, leaves
// other types as written, and refuses a payload it cannot convert.
func TestRenderWebhook(t *testing.T) {
	t.Parallel()
	const (
		v1 = `{"amount_minor":1250,"currency":"EUR","merchant_id":"m1","payout_id":"p1"}`
		v2 = `{"amount":{"currency":"EUR","minor":1250},"merchant_id":"m1","payout_id":"p1"}`
	)
	at := time.Date(2026, 12, 5, 7, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, eventType string
		version         int
		payload, api    string
		want            string // the data; "" for an error
	}{
		{"v2 event to a v1 endpoint", payouts.SentType, 2, v2, "v1", v1},
		{"v2 event to a v2 endpoint", payouts.SentType, 2, v2, "v2", v2},
		{"v1 event to a v1 endpoint", payouts.SentType, 1, v1, "v1", v1},
		{"v1 event to a v2 endpoint", payouts.SentType, 1, v1, "v2", v2},
		{"unknown api version: the current shape", payouts.SentType, 2, v2, "v9", v2},
		{"another type is as written", payouts.FailedType, 1, `{"reason":"closed"}`, "v1", `{"reason":"closed"}`},
		{"a v2 without an amount", payouts.SentType, 2, `{"payout_id":"p1"}`, "v1", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := webhooks.Message{ID: "msg1", AccountID: "m1", EventType: tc.eventType, OccurredAt: at,
				SchemaVersion: tc.version, Payload: json.RawMessage(tc.payload)}
			got, err := payouts.RenderWebhook(context.Background(), m, tc.api)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("rendered %s, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := `{"type":"` + tc.eventType + `","timestamp":"2026-12-05T07:00:00Z","data":` + tc.want + `}`
			if string(got) != want {
				t.Fatalf("got  %s\nwant %s", got, want)
			}
			again, _ := payouts.RenderWebhook(context.Background(), m, tc.api)
			if !bytes.Equal(got, again) {
				t.Fatalf("not deterministic: %s then %s", got, again)
			}
		})
	}
}
