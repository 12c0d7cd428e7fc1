package webhookapi_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/fanout"
	"github.com/outflow-dev/outflow/webhooks/webhookapi"
)

// The delivery routes over the deliveries package: list, attempts,
// resend, recover, test, each waking the sender once it committed.
func TestDeliveryRoutes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, webhookapi.Config{})
	id := e.create("acct", `{"url":"`+hook+`"}`)["id"].(string)
	base := "/accounts/acct/webhook_endpoints/" + id
	msg := webhooks.Message{ID: uuid.NewString(), AccountID: "acct", EventType: "payment.paid", OccurredAt: time.Now(),
		Payload: json.RawMessage(`{"amount":1}`)}
	if _, err := fanout.Enqueue(ctx, e.pool, msg, fanout.Target{}, ""); err != nil {
		t.Fatal(err)
	}

	list := e.do("acct", "GET", base+"/messages", "")
	data, _ := list.body["data"].([]any)
	if list.status != 200 || len(data) != 1 || data[0].(map[string]any)["message_id"] != msg.ID ||
		data[0].(map[string]any)["status"] != "pending" {
		t.Fatalf("messages: %d %s", list.status, list.raw)
	}
	for q, field := range map[string]string{"status=sent": "status", "limit=251": "limit"} {
		if res := e.do("acct", "GET", base+"/messages?"+q, ""); res.status != 422 || errorField(res) != field {
			t.Errorf("messages?%s: %d %s", q, res.status, res.raw)
		}
	}
	if res := e.do("acct", "GET", base+"/messages?status=failed&limit=10", ""); res.status != 200 || len(res.body["data"].([]any)) != 0 {
		t.Errorf("messages?status=failed: %d %s", res.status, res.raw)
	}

	if _, err := e.pool.Exec(ctx, `UPDATE webhook_endpoint_deliveries SET status = 'failed', settled_at = now(), last_error = 'HTTP 500'`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO webhook_endpoint_attempts (delivery_id, endpoint_id, latency_ms, status_code, response_body)
		SELECT id, endpoint_id, 12.5, 500, 'oops' FROM webhook_endpoint_deliveries`); err != nil {
		t.Fatal(err)
	}
	att := e.do("acct", "GET", base+"/messages/"+msg.ID+"/attempts", "")
	if adata, _ := att.body["data"].([]any); att.status != 200 || len(adata) != 1 || adata[0].(map[string]any)["status_code"] != 500.0 {
		t.Fatalf("attempts: %d %s", att.status, att.raw)
	}
	if res := e.do("acct", "GET", base+"/messages/"+uuid.NewString()+"/attempts", ""); res.status != 404 {
		t.Errorf("attempts of an unknown message: %d %s", res.status, res.raw)
	}

	res := e.do("acct", "POST", base+"/messages/"+msg.ID+"/resend", "")
	if res.status != 202 || res.body["status"] != "pending" || e.wakes.Load() != 1 {
		t.Fatalf("resend: %d %s, %d wakes", res.status, res.raw, e.wakes.Load())
	}
	if res := e.do("acct", "POST", base+"/messages/"+uuid.NewString()+"/resend", ""); res.status != 404 || e.wakes.Load() != 1 {
		t.Errorf("resend of an unknown message: %d %s, %d wakes", res.status, res.raw, e.wakes.Load())
	}

	if _, err := e.pool.Exec(ctx, `UPDATE webhook_endpoint_deliveries SET status = 'failed', settled_at = now()`); err != nil {
		t.Fatal(err)
	}
	since := `{"since":"` + time.Now().Add(-time.Hour).Format(time.RFC3339) + `"}`
	res = e.do("acct", "POST", base+"/recover", since)
	if res.status != 202 || res.body["recovered"] != 1.0 || e.wakes.Load() != 2 {
		t.Fatalf("recover: %d %s, %d wakes", res.status, res.raw, e.wakes.Load())
	}

	res = e.do("acct", "POST", base+"/test", "")
	testID, _ := res.body["message_id"].(string)
	if res.status != 202 || testID == "" || e.wakes.Load() != 3 {
		t.Fatalf("test: %d %s, %d wakes", res.status, res.raw, e.wakes.Load())
	}
	if list := e.do("acct", "GET", base+"/messages?event_type="+webhooks.EventTest, ""); len(list.body["data"].([]any)) != 1 {
		t.Fatalf("the test message is not listed: %s", list.raw)
	}

	if res := e.do("acct", "POST", base+"/disable", ""); res.status != 200 {
		t.Fatal(res.raw)
	}
	for _, p := range []string{"/test", "/messages/" + msg.ID + "/resend"} {
		if res := e.do("acct", "POST", base+p, ""); res.status != 409 || errorCode(res) != "endpoint_disabled" {
			t.Errorf("%s to a disabled endpoint: %d %s", p, res.status, res.raw)
		}
	}
	if res := e.do("acct", "POST", base+"/recover", since); res.status != 409 {
		t.Errorf("recover of a disabled endpoint: %d %s", res.status, res.raw)
	}
	if e.wakes.Load() != 3 {
		t.Errorf("refused commands woke the sender: %d wakes", e.wakes.Load())
	}
}
