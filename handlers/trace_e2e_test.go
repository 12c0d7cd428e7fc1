package handlers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/apikey"
	"github.com/outflow-dev/outflow/app/httpapi"
	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/tracing"
)

// receiptIssued is what the test's "receipts" handler writes for each
// payment event it handles: an event written by a handler.
type receiptIssued struct {
	PaymentEvent string `json:"payment_event"`
}

func (receiptIssued) EventType() string { return "receipt.issued" }

// recordSpans makes an in-memory recorder the global TracerProvider until
// the test ends. Not for parallel tests: the provider is process-wide.
func recordSpans(t *testing.T) *tracetest.SpanRecorder {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })
	return rec
}

// One trace from the HTTP requests that changed state to the handlers of
// their events and the events those handlers wrote: the API's server spans
// are children of the request's traceparent; each outbox row carries the
// context of the server span that wrote it; the forwarder's send spans link
// to those contexts; each consumer's process span is a child of its event's
// row context; the events a handler writes carry its span's context and the
// request's correlation id.
//
// On Redis and on the PostgreSQL (sql) backend; not in parallel: the
// TracerProvider is global.
func TestTraceFromRequestToHandlers(t *testing.T) {
	t.Run("redis", func(t *testing.T) { traceFromRequest(t, newPipeline(t), "redis") })
	t.Run("sql", func(t *testing.T) {
		p := newPipeline(t)
		for _, b := range backends {
			if b.kind == brokers.SQL {
				p.backend = b.open(t)
			}
		}
		require.NotNil(t, p.backend, "the sql backend is not in the end-to-end suite's backends")
		traceFromRequest(t, p, "sql")
	})
}

func traceFromRequest(t *testing.T, p *pipeline, system string) {
	rec := recordSpans(t)
	m, site := p.newMerchant(t)
	ctx := context.Background()

	receipts, err := outbox.NewWriter(outbox.Config{}) // topic "receipt", its aggregate type
	require.NoError(t, err)
	receiptHandler := consumer.Handler{Name: "receipts", Topic: app.PaymentsTopic,
		Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
			r, err := events.New(ctx, events.Aggregate{Type: "receipt", ID: ev.MessageID, Version: 1},
				receiptIssued{PaymentEvent: ev.MessageID})
			if err != nil {
				return err
			}
			return receipts.PublishTx(ctx, tx, r)
		}}
	run(t, p.worker(t, 5*time.Second, receiptHandler).Run)
	p.runForwarder(t, 0)

	api, err := httpapi.New(httpapi.Config{Service: p.svc, Pool: p.schema.Pool, Logger: quiet})
	require.NoError(t, err)
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	key, err := apikey.Create(ctx, p.schema.Pool, apikey.New{Name: "tracing test"})
	require.NoError(t, err)

	// The caller's own span: the parent of the API's server spans.
	const (
		traceID    = "4bf92f3577b34da6a3ce929d0e0e4736"
		callerSpan = "00f067aa0ba902b7"
		corr       = "trace-test-correlation"
	)
	post := func(path string, body any) map[string]any {
		t.Helper()
		b, err := json.Marshal(body)
		require.NoError(t, err)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, bytes.NewReader(b))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+key.Secret)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", "00-"+traceID+"-"+callerSpan+"-01")
		req.Header.Set("X-Correlation-ID", corr)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		require.Less(t, resp.StatusCode, 300, "POST %s: %v", path, out)
		return out
	}
	pay := post("/v1/payments", map[string]any{"merchant_id": m.ID, "amount": 1250, "currency": "EUR"})
	post(fmt.Sprintf("/v1/payments/%s/pay", pay["id"]), map[string]any{})

	// The payment events and, once the receipts handler ran for each, its
	// receipts, each with the traceparent and correlation id of its row.
	type row struct{ id, typ, topic, tp, corr, cause string }
	rows := func() []row {
		rs, err := p.schema.Pool.Query(ctx, `SELECT message_id::text, event_type, topic, coalesce(metadata->>'traceparent', ''),
			coalesce(metadata->>'correlation_id', ''), coalesce(payload->>'payment_event', '') FROM outbox ORDER BY id`)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (row, error) {
			var x row
			return x, r.Scan(&x.id, &x.typ, &x.topic, &x.tp, &x.corr, &x.cause)
		})
		require.NoError(t, err)
		return out
	}
	var all []row
	// Two hops through the outbox, the forwarder and the broker (the
	// receipts are events too): on the sql backend, polled at each hop,
	// this passed 30 s twice in a suite at load 20+ (2.4 s alone).
	outflowtest.WaitFor(t, 90*time.Second, "a receipt for each payment event", func() bool {
		all = rows()
		payments, receipts := 0, 0
		for _, r := range all {
			if r.topic == "receipt" {
				receipts++
			} else {
				payments++
			}
		}
		return payments == 2 && receipts == 2
	})
	// A process span ends when its handler returns, maybe after the
	// row it wrote is visible: wait for them.
	processOf := func(messageID string) []sdktrace.ReadOnlySpan {
		var out []sdktrace.ReadOnlySpan
		for _, s := range rec.Ended() {
			if s.SpanKind() == trace.SpanKindConsumer && attr(s, "messaging.message.id") == messageID {
				out = append(out, s)
			}
		}
		return out
	}
	// The consumers of each event type (the others skip it unseen).
	consumers := map[string][]string{
		paymentevents.CreatedType: {"receipts"},
		paymentevents.PaidType:    {"notify-merchant", "receipts", "sync-analytics"},
	}
	outflowtest.WaitFor(t, 30*time.Second, "each payment event's process spans", func() bool {
		for _, r := range all {
			if r.topic != "receipt" && len(processOf(r.id)) < len(consumers[r.typ]) {
				return false
			}
		}
		return true
	})

	// The paid event's webhook: a client span, child of NotifyMerchant's
	// process span, whose context the merchant received as traceparent.
	var paidID string
	for _, r := range all {
		if r.typ == paymentevents.PaidType {
			paidID = r.id
		}
	}
	var webhookTP string
	outflowtest.WaitFor(t, 30*time.Second, "the paid event's webhook and its client span", func() bool {
		site.mu.Lock()
		webhookTP = site.traces[paidID]
		site.mu.Unlock()
		if webhookTP == "" {
			return false
		}
		for _, s := range rec.Ended() {
			if s.SpanKind() == trace.SpanKindClient && s.SpanContext().SpanID() == tracing.SpanContext(webhookTP).SpanID() {
				return true
			}
		}
		return false
	})

	spans := rec.Ended()
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byID[s.SpanContext().SpanID()] = s
	}
	wantTrace, err := trace.TraceIDFromHex(traceID)
	require.NoError(t, err)
	parentSpan, err := trace.SpanIDFromHex(callerSpan)
	require.NoError(t, err)

	var servers int
	for _, s := range spans {
		if s.SpanKind() != trace.SpanKindServer || s.SpanContext().TraceID() != wantTrace {
			continue
		}
		servers++
		require.Equal(t, parentSpan, s.Parent().SpanID(), "server span %q: a child of the request's traceparent", s.Name())
		require.True(t, s.Parent().IsRemote())
	}
	require.Equal(t, 2, servers, "one server span per request, in the caller's trace")

	rowByID := map[string]row{}
	for _, r := range all {
		rowByID[r.id] = r
	}
	for _, r := range all {
		sc := tracing.SpanContext(r.tp)
		require.True(t, sc.IsValid(), "row %s (%s): traceparent %q", r.id, r.typ, r.tp)
		require.Equal(t, wantTrace, sc.TraceID(), "row %s (%s): in the request's trace", r.id, r.typ)
		require.Equal(t, corr, r.corr, "row %s (%s): the request's correlation id", r.id, r.typ)
		writer, ok := byID[sc.SpanID()]
		require.True(t, ok, "row %s (%s): its traceparent names a recorded span", r.id, r.typ)
		if r.topic == "receipt" {
			// Written by the receipts handler: its process span for the
			// payment event it handled wrote it.
			require.Equal(t, trace.SpanKindConsumer, writer.SpanKind(), "receipt %s", r.id)
			require.Equal(t, "receipts", attr(writer, "messaging.consumer.group.name"))
			require.Equal(t, rowByID[r.cause].id, attr(writer, "messaging.message.id"))
			continue
		}
		// A payment event: written by a server span.
		require.Equal(t, trace.SpanKindServer, writer.SpanKind(), "row %s (%s)", r.id, r.typ)

		// The forwarder's send span links to the row's context, in a
		// trace of its own.
		var linked bool
		for _, s := range spans {
			if s.SpanKind() != trace.SpanKindProducer {
				continue
			}
			for _, l := range s.Links() {
				if l.SpanContext.SpanID() == sc.SpanID() && l.SpanContext.TraceID() == sc.TraceID() {
					linked = true
					require.NotEqual(t, wantTrace, s.SpanContext().TraceID(), "a batch's send span roots its own trace")
					if s.Name() == "send" { // a wave of payments and receipts
						require.Empty(t, attr(s, "messaging.destination.name"))
					} else {
						require.Equal(t, "send "+app.PaymentsTopic, s.Name())
						require.Equal(t, app.PaymentsTopic, attr(s, "messaging.destination.name"))
					}
					require.Equal(t, system, attr(s, "messaging.system"))
					require.Equal(t, "send", attr(s, "messaging.operation.type"))
				}
			}
		}
		require.True(t, linked, "row %s (%s): a send span links to its context", r.id, r.typ)

		// Each consumer's process span is a child of the row's context.
		var groups []string
		for _, s := range processOf(r.id) {
			require.Equal(t, sc.TraceID(), s.SpanContext().TraceID(), "process span %q of %s", s.Name(), r.id)
			require.Equal(t, sc.SpanID(), s.Parent().SpanID(), "process span %q of %s: a child of the row's context", s.Name(), r.id)
			require.Equal(t, "process "+app.PaymentsTopic, s.Name())
			require.Equal(t, system, attr(s, "messaging.system"))
			require.Equal(t, "process", attr(s, "messaging.operation.type"))
			require.Equal(t, app.PaymentsTopic, attr(s, "messaging.destination.name"))
			groups = append(groups, attr(s, "messaging.consumer.group.name"))
		}
		// A handler may run twice (a shared batch rolled back): once per
		// consumer at least, and no other consumer.
		slices.Sort(groups)
		groups = slices.Compact(groups)
		if r.typ == paymentevents.PaidType {
			client := byID[tracing.SpanContext(webhookTP).SpanID()]
			require.Equal(t, trace.SpanKindClient, client.SpanKind())
			require.Equal(t, wantTrace, client.SpanContext().TraceID(), "the webhook's client span, in the request's trace")
			notify := byID[client.Parent().SpanID()]
			require.NotNil(t, notify, "the client span's parent is recorded")
			require.Equal(t, "notify-merchant", attr(notify, "messaging.consumer.group.name"), "the client span's parent")
			require.Equal(t, r.id, attr(notify, "messaging.message.id"))
			require.Equal(t, "POST", client.Name())
		}
		require.Equal(t, consumers[r.typ], groups, "row %s (%s): one process span per consumer", r.id, r.typ)
	}
}

// attr returns s's attribute key as a string ("" when absent).
func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if kv.Key == attribute.Key(key) {
			return kv.Value.Emit()
		}
	}
	return ""
}
