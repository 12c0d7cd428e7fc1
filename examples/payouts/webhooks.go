package payouts

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/endpoints"
	"github.com/outflow-dev/outflow/webhooks/fanout"
	"github.com/outflow-dev/outflow/webhooks/webhookapi"
)

// APIVersion is the payload version a merchant's new webhook endpoint is
// pinned to (endpoints.Config.APIVersion): "v2" since payout.sent's data
// carries one money object. Endpoints made while it was "v1" keep
// receiving the flat shape they were written against; see [RenderWebhook].
const APIVersion = "v2"

// WebhooksName is the [WebhookFanout] consumer's name: its consumer group
// and its deduplication key.
const WebhooksName = "payout-webhooks"

// WebhookFanout is the consumer that records, in its transaction, one
// webhook message per payout event for the endpoints of the payout's
// merchant (the account, in the webhooks packages' terms) that want it.
// It calls no endpoint: a sender does, after the commit, woken by wake
// (its Wake; nil when it runs in another process and polls).
func WebhookFanout(wake func()) consumer.Handler {
	return fanout.Handler(WebhooksName, AggregateType, fanout.Config{
		Account: func(_ context.Context, _ pgx.Tx, ev events.Event) (string, error) {
			switch p := ev.Payload.(type) {
			case Requested:
				return p.MerchantID, nil
			case Sent:
				return p.MerchantID, nil
			case Failed:
				return p.MerchantID, nil
			}
			return "", fmt.Errorf("payout webhooks: no merchant in a %T", ev.Payload)
		},
		Wake: wake,
	}, RequestedType, SentType, FailedType)
}

// sentVersions is payout.sent's schema version in each API version: the
// shape of data an endpoint pinned to it receives.
var sentVersions = map[string]int{"v1": 1, "v2": 2}

// RenderWebhook is the sender's Renderer: the envelope of
// webhooks.DefaultRenderer, its data in the shape of the endpoint's
// api_version. payout.sent is stored at its schema version (2: the
// consumer's registry upcasts older ones); an endpoint pinned to "v1" gets
// it as version 1 wrote it, amount_minor and currency side by side, since
// that is what its receiver was written against. Other types have one
// shape, and an unknown version gets the current one.
func RenderWebhook(ctx context.Context, m webhooks.Message, apiVersion string) ([]byte, error) {
	if m.EventType == SentType {
		want, ok := sentVersions[apiVersion]
		if !ok {
			want = Sent{}.SchemaVersion()
		}
		var err error
		switch {
		case m.SchemaVersion < 2 && want >= 2:
			m.Payload, err = sentFromV1(m.Payload)
		case m.SchemaVersion >= 2 && want < 2:
			m.Payload, err = sentToV1(m.Payload)
		}
		if err != nil {
			return nil, fmt.Errorf("render %s %s for api version %q: %w", m.EventType, m.ID, apiVersion, err)
		}
	}
	return webhooks.DefaultRenderer(ctx, m, apiVersion)
}

// sentToV1 is [sentFromV1] backwards: {"amount":{"minor":1250,
// "currency":"EUR"},...} to {"amount_minor":1250,"currency":"EUR",...}.
// Its output is deterministic (a retry signs the same bytes): encoding/json
// sorts a map's keys.
func sentToV1(cur json.RawMessage) (json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(cur, &m); err != nil {
		return nil, err
	}
	var amount struct {
		Minor    json.RawMessage `json:"minor"`
		Currency json.RawMessage `json:"currency"`
	}
	if err := json.Unmarshal(m["amount"], &amount); err != nil || amount.Minor == nil || amount.Currency == nil {
		return nil, errors.New("payout.sent v2 without amount.minor and amount.currency")
	}
	delete(m, "amount")
	m["amount_minor"], m["currency"] = amount.Minor, amount.Currency
	return json.Marshal(m)
}

// NewWebhookAPI returns the merchants' webhook API over store: their
// endpoints, deliveries, resends and test events. A request acts on the
// merchant of the path only if it is the merchant its API key
// authenticated (see [MountWebhooks]); any other is 404, as a merchant
// that does not exist. wake is the in-process sender's Wake, or nil.
func NewWebhookAPI(pool *pgxpool.Pool, store *endpoints.Store, wake func(), logger *slog.Logger) (*webhookapi.API, error) {
	return webhookapi.New(webhookapi.Config{
		Endpoints:    store,
		Pool:         pool,
		AccountParam: "id",
		Authorize: func(r *http.Request, merchant string) bool {
			caller, ok := r.Context().Value(merchantKey{}).(string)
			return ok && caller == merchant
		},
		Wake:   wake,
		Logger: logger,
	})
}

// MountWebhooks registers the webhook API's routes on mux under
// /merchants/{id}, each behind the service's own authentication: a
// merchant's API key, "Authorization: Bearer <key>" (401 without one).
func MountWebhooks(mux *http.ServeMux, api *webhookapi.API, auth Authenticator) {
	for _, rt := range api.Routes() {
		mux.Handle("/merchants/{id}"+rt.Pattern, authenticate(auth, rt.Handler))
	}
}

// Authenticator returns the merchant an API key belongs to: the service's
// authentication, which the webhooks packages leave to it.
type Authenticator func(ctx context.Context, apiKey string) (merchantID string, ok bool)

// StaticKeys authenticates the API keys of keys (key to merchant id), as
// the example's command reads them from its environment; a real service
// looks its keys up, hashed, in its database.
func StaticKeys(keys map[string]string) Authenticator {
	return func(_ context.Context, apiKey string) (string, bool) {
		merchant, found := "", false
		for k, m := range keys {
			// Every key compared in full: how long a miss takes tells
			// nothing of how close it came.
			if subtle.ConstantTimeCompare([]byte(k), []byte(apiKey)) == 1 {
				merchant, found = m, true
			}
		}
		return merchant, found
	}
}

type merchantKey struct{}

func authenticate(auth Authenticator, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		merchant := ""
		if ok && key != "" {
			merchant, ok = auth(r.Context(), key)
		}
		if !ok || key == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="payouts"`)
			writeJSON(w, http.StatusUnauthorized, errorBody{Error: "a merchant API key is required", Field: "Authorization"})
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), merchantKey{}, merchant)))
	})
}
