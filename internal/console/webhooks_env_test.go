package console_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/endpoints"
	"github.com/outflow-dev/outflow/webhooks/fanout"
	"github.com/outflow-dev/outflow/webhooks/schema"
)

// The webhooks' test data, made with the webhooks packages (endpoints,
// fanout) as a service makes it; the states a sender would reach are set
// with SQL.

// testAccount is the account insertDelivery's deliveries are of.
const testAccount = "acct-a"

// hookStore creates the tests' endpoints: AllowPrivate for their URLs.
var hookStore = func() *endpoints.Store {
	s, err := endpoints.New(endpoints.Config{AllowPrivate: true})
	if err != nil {
		panic(err)
	}
	return s
}()

// installWebhooks migrates the webhooks set into s unless its tables are
// there already (an app set that includes them).
func installWebhooks(t *testing.T, s *outflowtest.Schema) {
	t.Helper()
	var there bool
	require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT to_regclass('webhook_endpoints') IS NOT NULL`).Scan(&there))
	if !there {
		m, err := migrations.NewMigrator(s.OpenDB(t), schema.Set(), migrations.Config{})
		require.NoError(t, err)
		_, err = m.Up(context.Background())
		require.NoError(t, err)
	}
}

// hookEndpoint creates an endpoint of account and returns its id.
func (e *env) hookEndpoint(t *testing.T, account, url string) string {
	t.Helper()
	c, err := hookStore.Create(context.Background(), e.pool, account, endpoints.NewEndpoint{URL: url, Description: "orders"})
	require.NoError(t, err)
	return c.ID
}

// hookMessage records the message messageID ("": a new id) of account
// to the endpoint ep, with its delivery, as fanout does for an event.
func (e *env) hookMessage(t *testing.T, account, ep, messageID, eventType string) string {
	t.Helper()
	if messageID == "" {
		messageID = uuid.Must(uuid.NewV7()).String()
	}
	payload, _ := json.Marshal(map[string]string{"id": messageID})
	r, err := fanout.Enqueue(context.Background(), e.pool, webhooks.Message{ID: messageID, AccountID: account, EventType: eventType,
		OccurredAt: time.Now().UTC(), SchemaVersion: 1, Payload: payload}, fanout.Target{Endpoints: []string{ep}, AllTypes: true}, "")
	require.NoError(t, err)
	require.True(t, r.Recorded)
	return messageID
}

// hookDelivery records a message to ep and sets its delivery to status
// with attempts and lastError; it returns the delivery's id and the
// message's.
func (e *env) hookDelivery(t *testing.T, account, ep, status string, attempts int, lastError string) (int64, string) {
	t.Helper()
	mid := e.hookMessage(t, account, ep, "", "payment.paid")
	var id int64
	require.NoError(t, e.pool.QueryRow(context.Background(), `UPDATE webhook_endpoint_deliveries SET status = $3, attempts = $4,
		    last_error = nullif($5, ''), settled_at = CASE WHEN $3 = 'pending' THEN NULL ELSE now() END
		WHERE message_id = $1 AND endpoint_id = $2 RETURNING id`, mid, ep, status, attempts, lastError).Scan(&id))
	return id, mid
}

// insertDelivery records a delivery of testAccount's endpoint (made on
// first use) in status ("dead" is the former name of failed).
func (e *env) insertDelivery(t *testing.T, status string, attempts int, lastError string) int64 {
	t.Helper()
	if status == "dead" {
		status = "failed"
	}
	if e.hookEP == "" {
		e.hookEP = e.hookEndpoint(t, testAccount, "https://merchant.example/hooks")
	}
	id, _ := e.hookDelivery(t, testAccount, e.hookEP, status, attempts, lastError)
	return id
}

// insertAttempts records an attempt of delivery per code (0: a network
// error, no status).
func (e *env) insertAttempts(t *testing.T, delivery int64, codes ...int) {
	t.Helper()
	for _, code := range codes {
		var errText *string
		if code == 0 {
			s := "connection refused"
			errText = &s
		}
		e.exec(t, `INSERT INTO webhook_endpoint_attempts (delivery_id, endpoint_id, status_code, latency_ms, error)
			SELECT id, endpoint_id, nullif($2, 0), 12, $3 FROM webhook_endpoint_deliveries WHERE id = $1`, delivery, code, errText)
	}
}
