package endpoints_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/endpoints"
	"github.com/outflow-dev/outflow/webhooks/fanout"
	"github.com/outflow-dev/outflow/webhooks/schema"
	"github.com/outflow-dev/outflow/webhooks/secretseal"
	"github.com/outflow-dev/outflow/webhooks/signing"
)

const hook = "https://hooks.example.com/in"

func setup(t *testing.T, cfg endpoints.Config) (*endpoints.Store, *pgxpool.Pool) {
	t.Helper()
	s := outflowtest.NewSchema(t, schema.Set())
	st, err := endpoints.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st, s.Pool
}

func testKey(t *testing.T) *secretseal.Key {
	t.Helper()
	k, err := secretseal.NewKey(make([]byte, secretseal.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func ptr[T any](v T) *T { return &v }

func create(t *testing.T, st *endpoints.Store, db webhooks.DB, account string, in endpoints.NewEndpoint) endpoints.Created {
	t.Helper()
	if in.URL == "" {
		in.URL = hook
	}
	c, err := st.Create(context.Background(), db, account, in)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCRUD(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, pool := setup(t, endpoints.Config{APIVersion: "2026-01-01"})
	c := create(t, st, pool, "acct", endpoints.NewEndpoint{URL: hook, Description: "orders", EventTypes: []string{"payment.*"},
		RateLimit: ptr(5)})
	if err := signing.CheckSecret(c.Secret); err != nil || !strings.HasPrefix(c.Secret, signing.SecretPrefix) {
		t.Fatalf("secret %q: %v", c.Secret, err)
	}
	if u, err := uuid.Parse(c.ID); err != nil || u.Version() != 7 {
		t.Fatalf("id %q is not a uuid v7", c.ID)
	}
	want := endpoints.Endpoint{ID: c.ID, AccountID: "acct", URL: hook, Description: "orders", EventTypes: []string{"payment.*"},
		APIVersion: "2026-01-01", RateLimit: ptr(5), CreatedAt: c.CreatedAt, UpdatedAt: c.UpdatedAt}
	got, err := st.Get(ctx, pool, "acct", c.ID)
	if err != nil {
		t.Fatal(err)
	}
	equal(t, got, want)
	equal(t, c.Endpoint, want)
	if got.CreatedAt.Location() != time.UTC || got.UpdatedAt.Location() != time.UTC {
		t.Fatalf("times not in UTC (run with TZ set to see it): %v", got.CreatedAt)
	}
	b, _ := json.Marshal(got)
	if strings.Contains(string(b), "whsec_") || strings.Contains(string(b), "secret") {
		t.Fatalf("an endpoint's JSON holds its secret: %s", b)
	}

	second := create(t, st, pool, "acct", endpoints.NewEndpoint{})
	create(t, st, pool, "other", endpoints.NewEndpoint{})
	list, err := st.List(ctx, pool, "acct")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != c.ID || list[1].ID != second.ID {
		t.Fatalf("List = %+v, want %s then %s", list, c.ID, second.ID)
	}
	if list[1].EventTypes == nil || len(list[1].EventTypes) != 0 || list[1].RateLimit != nil {
		t.Fatalf("an endpoint made with no filter and no limit: %+v", list[1])
	}

	// An update changes what it sets, nothing else.
	up, err := st.Update(ctx, pool, "acct", c.ID, endpoints.Update{Description: ptr("refunds"), EventTypes: ptr([]string{})})
	if err != nil {
		t.Fatal(err)
	}
	want.Description, want.EventTypes, want.UpdatedAt = "refunds", []string{}, up.UpdatedAt
	equal(t, up, want)
	up, err = st.Update(ctx, pool, "acct", c.ID, endpoints.Update{URL: ptr(hook + "/2"), RateLimit: ptr(7)})
	if err != nil {
		t.Fatal(err)
	}
	want.URL, want.RateLimit, want.UpdatedAt = hook+"/2", ptr(7), up.UpdatedAt
	equal(t, up, want)
	up, err = st.Update(ctx, pool, "acct", c.ID, endpoints.Update{ClearRateLimit: true})
	if err != nil {
		t.Fatal(err)
	}
	want.RateLimit, want.UpdatedAt = nil, up.UpdatedAt
	equal(t, up, want)
	up, err = st.Update(ctx, pool, "acct", c.ID, endpoints.Update{})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, up, want)

	if err := st.Delete(ctx, pool, "acct", c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, pool, "acct", c.ID); !errors.Is(err, webhooks.ErrNotFound) {
		t.Fatalf("Get after Delete: %v, want ErrNotFound", err)
	}
	if err := st.Delete(ctx, pool, "acct", c.ID); !errors.Is(err, webhooks.ErrNotFound) {
		t.Fatalf("Delete twice: %v, want ErrNotFound", err)
	}
}

func equal(t *testing.T, got, want endpoints.Endpoint) {
	t.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		t.Fatalf("endpoint\n got %s\nwant %s", g, w)
	}
}

// Another account's endpoint is not found, whatever the call, and stays
// as it was; so is a string that is no endpoint id.
func TestOtherAccountsEndpointIsNotFound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, pool := setup(t, endpoints.Config{})
	c := create(t, st, pool, "acct", endpoints.NewEndpoint{})
	calls := map[string]func(account, id string) error{
		"Get": func(a, id string) error { _, err := st.Get(ctx, pool, a, id); return err },
		"Update": func(a, id string) error {
			_, err := st.Update(ctx, pool, a, id, endpoints.Update{Description: ptr("x")})
			return err
		},
		"Disable": func(a, id string) error { _, err := st.Disable(ctx, pool, a, id); return err },
		"Enable":  func(a, id string) error { _, err := st.Enable(ctx, pool, a, id); return err },
		"Rotate":  func(a, id string) error { _, err := st.RotateSecret(ctx, pool, a, id); return err },
		"Delete":  func(a, id string) error { return st.Delete(ctx, pool, a, id) },
	}
	for name, call := range calls {
		for _, id := range []string{c.ID, "not-a-uuid", uuid.NewString(), "{" + c.ID + "}"} {
			if err := call("intruder", id); !errors.Is(err, webhooks.ErrNotFound) {
				t.Errorf("%s(intruder, %s) = %v, want ErrNotFound", name, id, err)
			}
		}
	}
	var secret string
	if err := pool.QueryRow(ctx, `SELECT secret FROM webhook_endpoints WHERE id = $1`, c.ID).Scan(&secret); err != nil {
		t.Fatal(err)
	}
	got, err := st.Get(ctx, pool, "acct", c.ID)
	if err != nil {
		t.Fatal(err)
	}
	equal(t, got, c.Endpoint)
	if secret != c.Secret {
		t.Fatal("another account's rotation changed the secret")
	}
}

func TestValidation(t *testing.T) {
	t.Parallel()
	st, err := endpoints.New(endpoints.Config{})
	if err != nil {
		t.Fatal(err)
	}
	many := make([]string, endpoints.MaxEventTypes+1)
	for i := range many {
		many[i] = "t" + strings.Repeat("x", i%50) + string(rune('a'+i%26)) + "." + string(rune('a'+i/26))
	}
	tests := []struct {
		name  string
		in    endpoints.NewEndpoint
		field string // "": valid
	}{
		{"valid", endpoints.NewEndpoint{URL: hook, EventTypes: []string{"payment.paid", "refund.*", "a-b_c.9"}, RateLimit: ptr(10000)}, ""},
		{"no url", endpoints.NewEndpoint{}, "url"},
		{"http url", endpoints.NewEndpoint{URL: "http://hooks.example.com/"}, "url"},
		{"private url", endpoints.NewEndpoint{URL: "https://127.0.0.1/"}, "url"},
		{"metadata url", endpoints.NewEndpoint{URL: "https://169.254.169.254/latest"}, "url"},
		{"url with control", endpoints.NewEndpoint{URL: hook + "\n"}, "url"},
		{"url with credentials", endpoints.NewEndpoint{URL: "https://u:p@hooks.example.com/"}, "url"},
		{"description 500", endpoints.NewEndpoint{URL: hook, Description: strings.Repeat("é", 500)}, ""},
		{"description 501", endpoints.NewEndpoint{URL: hook, Description: strings.Repeat("é", 501)}, "description"},
		{"description NUL", endpoints.NewEndpoint{URL: hook, Description: "a\x00b"}, "description"},
		{"description lines", endpoints.NewEndpoint{URL: hook, Description: "a\nb\tc"}, ""},
		{"empty type", endpoints.NewEndpoint{URL: hook, EventTypes: []string{""}}, "event_types"},
		{"upper type", endpoints.NewEndpoint{URL: hook, EventTypes: []string{"Payment.paid"}}, "event_types"},
		{"star alone", endpoints.NewEndpoint{URL: hook, EventTypes: []string{".*"}}, "event_types"},
		{"star inside", endpoints.NewEndpoint{URL: hook, EventTypes: []string{"payment.*.paid"}}, "event_types"},
		{"star without dot", endpoints.NewEndpoint{URL: hook, EventTypes: []string{"payment*"}}, "event_types"},
		{"long type", endpoints.NewEndpoint{URL: hook, EventTypes: []string{strings.Repeat("a", 101)}}, "event_types"},
		{"type 100", endpoints.NewEndpoint{URL: hook, EventTypes: []string{strings.Repeat("a", 100)}}, ""},
		{"duplicate type", endpoints.NewEndpoint{URL: hook, EventTypes: []string{"a.b", "a.b"}}, "event_types"},
		{"too many types", endpoints.NewEndpoint{URL: hook, EventTypes: many}, "event_types"},
		{"rate 0", endpoints.NewEndpoint{URL: hook, RateLimit: ptr(0)}, "rate_limit"},
		{"rate 10001", endpoints.NewEndpoint{URL: hook, RateLimit: ptr(10001)}, "rate_limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The checks run before any statement: a nil DB is never
			// reached for bad input.
			_, err := st.Create(context.Background(), nilDB{}, "acct", tt.in)
			var ve *webhooks.ValidationError
			switch {
			case tt.field == "" && errors.As(err, &ve):
				t.Fatalf("refused: %v", err)
			case tt.field != "" && !errors.As(err, &ve):
				t.Fatalf("err = %v, want a ValidationError on %s", err, tt.field)
			case tt.field != "" && ve.Field != tt.field:
				t.Fatalf("field %q (%v), want %q", ve.Field, err, tt.field)
			}
			if tt.field == "" {
				return
			}
			up := endpoints.Update{URL: &tt.in.URL, Description: &tt.in.Description, EventTypes: &tt.in.EventTypes, RateLimit: tt.in.RateLimit}
			if tt.field != "url" {
				up.URL = nil
			}
			_, err = st.Update(context.Background(), nilDB{}, "acct", uuid.NewString(), up)
			if !errors.As(err, &ve) || ve.Field != tt.field {
				t.Fatalf("Update: %v, want a ValidationError on %s", err, tt.field)
			}
		})
	}
	_, err = st.Update(context.Background(), nilDB{}, "acct", uuid.NewString(), endpoints.Update{RateLimit: ptr(1), ClearRateLimit: true})
	var ve *webhooks.ValidationError
	if !errors.As(err, &ve) || ve.Field != "rate_limit" {
		t.Fatalf("set and clear rate_limit: %v", err)
	}
}

// nilDB is a DB that fails the test's expectations if reached: valid
// input reaches it and gets its error back, which is no ValidationError.
type nilDB struct{ webhooks.DB }

func TestAllowPrivate(t *testing.T) {
	t.Parallel()
	st, pool := setup(t, endpoints.Config{AllowPrivate: true})
	create(t, st, pool, "acct", endpoints.NewEndpoint{URL: "http://127.0.0.1:8080/hook"})
}

// A secret is sealed at rest with its endpoint's id: it opens with that id
// only, so a sealed secret copied onto another endpoint does not open.
func TestSecretSealedWithEndpointID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	key := testKey(t)
	st, pool := setup(t, endpoints.Config{SecretKey: key})
	a := create(t, st, pool, "acct", endpoints.NewEndpoint{})
	b := create(t, st, pool, "acct", endpoints.NewEndpoint{})
	stored := func(id string) string {
		var s string
		if err := pool.QueryRow(ctx, `SELECT secret FROM webhook_endpoints WHERE id = $1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	sa := stored(a.ID)
	if !secretseal.Sealed(sa) || strings.Contains(sa, a.Secret) {
		t.Fatalf("stored %q, want it sealed", sa)
	}
	if got, err := secretseal.Open(key, sa, a.ID); err != nil || got != a.Secret {
		t.Fatalf("Open with its endpoint's id: %q, %v", got, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE webhook_endpoints SET secret = $1 WHERE id = $2`, sa, b.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := secretseal.Open(key, stored(b.ID), b.ID); !errors.Is(err, secretseal.ErrWrongKey) {
		t.Fatalf("a secret copied onto another endpoint opened: %v", err)
	}
	r, err := st.RotateSecret(ctx, pool, "acct", a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := secretseal.Open(key, stored(a.ID), a.ID); err != nil || got != r.Secret {
		t.Fatalf("the rotated secret: %q, %v", got, err)
	}
}

func TestRotationGrace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	st, pool := setup(t, endpoints.Config{SecretGrace: time.Hour, Now: clock})
	c := create(t, st, pool, "acct", endpoints.NewEndpoint{})
	secrets := func() (cur string, prev *string, until *time.Time) {
		if err := pool.QueryRow(ctx, `SELECT secret, previous_secret, previous_secret_expires_at
			FROM webhook_endpoints WHERE id = $1`, c.ID).Scan(&cur, &prev, &until); err != nil {
			t.Fatal(err)
		}
		return
	}
	r1, err := st.RotateSecret(ctx, pool, "acct", c.ID)
	if err != nil {
		t.Fatal(err)
	}
	cur, prev, until := secrets()
	if r1.EndpointID != c.ID || cur != r1.Secret || r1.Secret == c.Secret || prev == nil || *prev != c.Secret ||
		until == nil || !until.Equal(now.Add(time.Hour)) || !r1.PreviousSecretExpiresAt.Equal(now.Add(time.Hour)) {
		t.Fatalf("after a rotation: %+v, stored %q, %v, %v", r1, cur, prev, until)
	}
	// A second rotation in the grace drops the first secret.
	now = now.Add(time.Minute)
	r2, err := st.RotateSecret(ctx, pool, "acct", c.ID)
	if err != nil {
		t.Fatal(err)
	}
	cur, prev, until = secrets()
	if cur != r2.Secret || prev == nil || *prev != r1.Secret || !until.Equal(now.Add(time.Hour)) {
		t.Fatalf("after a second rotation: stored %q, %v, %v; want %q then %q", cur, prev, until, r2.Secret, r1.Secret)
	}

	noGrace, err := endpoints.New(endpoints.Config{SecretGrace: endpoints.NoGrace})
	if err != nil {
		t.Fatal(err)
	}
	r3, err := noGrace.RotateSecret(ctx, pool, "acct", c.ID)
	if err != nil {
		t.Fatal(err)
	}
	cur, prev, until = secrets()
	if cur != r3.Secret || prev != nil || until != nil || r3.PreviousSecretExpiresAt != nil {
		t.Fatalf("rotation without grace: %+v, stored %v, %v", r3, prev, until)
	}
}

func enqueue(t *testing.T, pool *pgxpool.Pool, account string) string {
	t.Helper()
	m := webhooks.Message{ID: uuid.NewString(), AccountID: account, EventType: "payment.paid", OccurredAt: time.Now(),
		Payload: json.RawMessage(`{}`)}
	if _, err := fanout.Enqueue(context.Background(), pool, m, fanout.Target{}, ""); err != nil {
		t.Fatal(err)
	}
	return m.ID
}

func statuses(t *testing.T, pool *pgxpool.Pool, endpoint string) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT status || coalesce(':' || last_error, '') || CASE WHEN settled_at IS NULL THEN '' ELSE ' settled' END
		FROM webhook_endpoint_deliveries WHERE endpoint_id = $1`, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out[s]++
	}
	return out
}

// Disabling fails the endpoint's pending deliveries (they would take the
// sender's capacity for nothing), and only its own.
func TestDisableFailsPendingDeliveries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, pool := setup(t, endpoints.Config{})
	a := create(t, st, pool, "acct", endpoints.NewEndpoint{})
	b := create(t, st, pool, "acct", endpoints.NewEndpoint{})
	enqueue(t, pool, "acct")
	enqueue(t, pool, "acct")
	if _, err := pool.Exec(ctx, `UPDATE webhook_endpoint_deliveries SET status = 'delivered', settled_at = now()
		WHERE id = (SELECT min(id) FROM webhook_endpoint_deliveries WHERE endpoint_id = $1)`, a.ID); err != nil {
		t.Fatal(err)
	}
	e, err := st.Disable(ctx, pool, "acct", a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !e.Disabled || e.DisabledReason != "manual" || e.DisabledAt == nil {
		t.Fatalf("Disable = %+v", e)
	}
	if got := statuses(t, pool, a.ID); got["failed:endpoint disabled settled"] != 1 || got["delivered settled"] != 1 || len(got) != 2 {
		t.Fatalf("disabled endpoint's deliveries: %v", got)
	}
	if got := statuses(t, pool, b.ID); got["pending"] != 2 || len(got) != 1 {
		t.Fatalf("the other endpoint's deliveries: %v", got)
	}
	// Disabling again keeps the first time and reason.
	if _, err := pool.Exec(ctx, `UPDATE webhook_endpoints SET disabled_reason = 'failing' WHERE id = $1`, a.ID); err != nil {
		t.Fatal(err)
	}
	again, err := st.Disable(ctx, pool, "acct", a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if again.DisabledReason != "failing" || !again.DisabledAt.Equal(*e.DisabledAt) {
		t.Fatalf("disabled twice: %+v", again)
	}
}

// Enabling clears the health record (not the failed deliveries: that is
// recovery's), and brings the deliveries that waited for the circuit due.
func TestEnableClearsHealth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, pool := setup(t, endpoints.Config{})
	a := create(t, st, pool, "acct", endpoints.NewEndpoint{})
	enqueue(t, pool, "acct")
	if _, err := st.Disable(ctx, pool, "acct", a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE webhook_endpoints SET disabled_reason = 'failing', failing_since = now() - interval '6 days',
		consecutive_failures = 40, circuit_open_until = now() + interval '1 hour' WHERE id = $1`, a.ID); err != nil {
		t.Fatal(err)
	}
	// A delivery that waits for the circuit's end, and one further off
	// (its own retry).
	enqueue(t, pool, "acct")
	if _, err := pool.Exec(ctx, `UPDATE webhook_endpoint_deliveries SET status = 'pending', last_error = NULL, settled_at = NULL,
		next_attempt_at = CASE WHEN id = (SELECT max(id) FROM webhook_endpoint_deliveries WHERE endpoint_id = $1)
		                  THEN (SELECT circuit_open_until FROM webhook_endpoints WHERE id = $1)
		                  ELSE now() + interval '5 hours' END
		WHERE endpoint_id = $1 AND id IN (SELECT id FROM webhook_endpoint_deliveries WHERE endpoint_id = $1 ORDER BY id DESC LIMIT 2)`,
		a.ID); err != nil {
		t.Fatal(err)
	}
	enqueue(t, pool, "acct") // recorded failed: the endpoint is disabled
	e, err := st.Enable(ctx, pool, "acct", a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if e.Disabled || e.DisabledAt != nil || e.DisabledReason != "" || e.FailingSince != nil {
		t.Fatalf("Enable = %+v", e)
	}
	var failures int
	var circuit *time.Time
	if err := pool.QueryRow(ctx, `SELECT consecutive_failures, circuit_open_until FROM webhook_endpoints WHERE id = $1`,
		a.ID).Scan(&failures, &circuit); err != nil {
		t.Fatal(err)
	}
	if failures != 0 || circuit != nil {
		t.Fatalf("after Enable: consecutive_failures %d, circuit_open_until %v", failures, circuit)
	}
	var due, later, failed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'pending' AND next_attempt_at <= now()),
		count(*) FILTER (WHERE status = 'pending' AND next_attempt_at > now() + interval '4 hours'),
		count(*) FILTER (WHERE status = 'failed')
		FROM webhook_endpoint_deliveries WHERE endpoint_id = $1`, a.ID).Scan(&due, &later, &failed); err != nil {
		t.Fatal(err)
	}
	if due != 1 || later != 1 || failed != 1 {
		t.Fatalf("after Enable: %d due, %d later, %d failed; want 1, 1, 1 (nothing failed is resent)", due, later, failed)
	}
}

func TestDeleteCascades(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, pool := setup(t, endpoints.Config{})
	a := create(t, st, pool, "acct", endpoints.NewEndpoint{})
	b := create(t, st, pool, "acct", endpoints.NewEndpoint{})
	enqueue(t, pool, "acct")
	if _, err := pool.Exec(ctx, `INSERT INTO webhook_endpoint_attempts (delivery_id, endpoint_id, latency_ms, status_code)
		SELECT id, endpoint_id, 12.5, 500 FROM webhook_endpoint_deliveries`); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(ctx, pool, "acct", a.ID); err != nil {
		t.Fatal(err)
	}
	var deliveries, attempts, others int
	if err := pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM webhook_endpoint_deliveries WHERE endpoint_id = $1),
		(SELECT count(*) FROM webhook_endpoint_attempts WHERE endpoint_id = $1),
		(SELECT count(*) FROM webhook_endpoint_attempts WHERE endpoint_id = $2)`, a.ID, b.ID).Scan(&deliveries, &attempts, &others); err != nil {
		t.Fatal(err)
	}
	if deliveries != 0 || attempts != 0 || others != 1 {
		t.Fatalf("after Delete: %d deliveries, %d attempts left; the other endpoint's attempts %d", deliveries, attempts, others)
	}
	// A message only the deleted endpoint had goes with it (retention,
	// which walks deliveries, would never find it); one the other endpoint
	// still has stays.
	only := uuid.NewString()
	if _, err := fanout.Enqueue(ctx, pool, webhooks.Message{ID: only, AccountID: "acct", EventType: "payment.paid",
		OccurredAt: time.Now()}, fanout.Target{Endpoints: []string{b.ID}}, ""); err != nil {
		t.Fatal(err)
	}
	var shared string
	if err := pool.QueryRow(ctx, `SELECT message_id::text FROM webhook_endpoint_deliveries WHERE endpoint_id = $1 AND message_id <> $2`,
		b.ID, only).Scan(&shared); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(ctx, pool, "acct", b.ID); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM webhook_messages`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d messages left after deleting every endpoint that had them (%s, %s)", left, only, shared)
	}
}

// MaxPerAccount holds under concurrent creations.
func TestMaxPerAccount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, pool := setup(t, endpoints.Config{MaxPerAccount: 3})
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for range 10 {
		wg.Go(func() {
			_, err := st.Create(ctx, pool, "acct", endpoints.NewEndpoint{URL: hook})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	made := 0
	for err := range errs {
		switch {
		case err == nil:
			made++
		case !errors.Is(err, endpoints.ErrTooMany):
			t.Fatal(err)
		}
	}
	list, err := st.List(ctx, pool, "acct")
	if err != nil {
		t.Fatal(err)
	}
	if made != 3 || len(list) != 3 {
		t.Fatalf("%d created, %d listed; want 3", made, len(list))
	}
	create(t, st, pool, "other", endpoints.NewEndpoint{})

	// Deterministically: a creation while another is uncommitted waits for
	// it, then counts it.
	create(t, st, pool, "race", endpoints.NewEndpoint{})
	create(t, st, pool, "race", endpoints.NewEndpoint{})
	first, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	if _, err := st.Create(ctx, first, "race", endpoints.NewEndpoint{URL: hook}); err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		_, err := st.Create(ctx, pool, "race", endpoints.NewEndpoint{URL: hook})
		second <- err
	}()
	var done error
	finished := false
	outflowtest.WaitFor(t, 10*time.Second, "the second creation waits for the first's lock, or ends", func() bool {
		select {
		case done = <-second:
			finished = true
			return true
		default:
		}
		var waiting int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid = $1::bigint::oid AND objid = (hashtext(current_schema() || '/race')::bigint & 4294967295)::oid`,
			0x6f757765).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting > 0
	})
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !finished {
		done = <-second
	}
	if !errors.Is(done, endpoints.ErrTooMany) {
		t.Fatalf("a creation concurrent with the account's last one: %v, want ErrTooMany", done)
	}
	if list, err := st.List(ctx, pool, "race"); err != nil || len(list) != 3 {
		t.Fatalf("%d endpoints, %v; want 3", len(list), err)
	}

	// Inside the caller's transaction too (the lock is the transaction's).
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := st.Create(ctx, tx, "acct", endpoints.NewEndpoint{URL: hook}); !errors.Is(err, endpoints.ErrTooMany) {
		t.Fatalf("Create in a transaction: %v, want ErrTooMany", err)
	}
	if _, err := st.Create(ctx, tx, "third", endpoints.NewEndpoint{URL: hook}); err != nil {
		t.Fatalf("Create in a transaction after a refusal: %v", err)
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []endpoints.Config{{MaxPerAccount: -1}, {MaxPerAccount: endpoints.ListLimit + 1}} {
		if _, err := endpoints.New(cfg); err == nil || !strings.Contains(err.Error(), "MaxPerAccount") {
			t.Errorf("New(%+v) = %v, want an error naming MaxPerAccount", cfg, err)
		}
	}
	st, err := endpoints.New(endpoints.Config{})
	if err != nil || st.MaxPerAccount() != endpoints.DefaultMaxPerAccount {
		t.Fatalf("defaults: %v", err)
	}
}

func TestSealSecrets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	key := testKey(t)
	plain, pool := setup(t, endpoints.Config{})
	var made []endpoints.Created
	for range 5 {
		made = append(made, create(t, plain, pool, "acct", endpoints.NewEndpoint{}))
	}
	rotated, err := plain.RotateSecret(ctx, pool, "acct", made[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	n, err := endpoints.SealSecrets(ctx, pool, key, 2)
	if err != nil || n != 5 {
		t.Fatalf("SealSecrets = %d, %v; want 5", n, err)
	}
	for i, c := range made {
		var cur string
		var prev *string
		if err := pool.QueryRow(ctx, `SELECT secret, previous_secret FROM webhook_endpoints WHERE id = $1`, c.ID).Scan(&cur, &prev); err != nil {
			t.Fatal(err)
		}
		want := c.Secret
		if i == 0 {
			want = rotated.Secret
			if prev == nil {
				t.Fatal("the previous secret is gone")
			}
			if p, err := secretseal.Open(key, *prev, c.ID); err != nil || p != c.Secret {
				t.Fatalf("previous secret: %q, %v", p, err)
			}
		}
		if got, err := secretseal.Open(key, cur, c.ID); !secretseal.Sealed(cur) || err != nil || got != want {
			t.Fatalf("endpoint %d: %q, %v", i, got, err)
		}
	}
	if n, err := endpoints.SealSecrets(ctx, pool, key, 2); err != nil || n != 0 {
		t.Fatalf("SealSecrets again = %d, %v; want 0", n, err)
	}
	if _, err := endpoints.SealSecrets(ctx, pool, nil, 2); !errors.Is(err, secretseal.ErrNoKey) {
		t.Fatalf("without a key: %v", err)
	}
}

// Enabling also ends a hold: the backlog that waited for a retry's
// outcome is due, the retry itself keeps its time.
func TestEnableReleasesAHeldBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, pool := setup(t, endpoints.Config{})
	a := create(t, st, pool, "acct", endpoints.NewEndpoint{})
	enqueue(t, pool, "acct")
	enqueue(t, pool, "acct")
	if _, err := pool.Exec(ctx, `UPDATE webhook_endpoints SET failing_since = now(), consecutive_failures = 1,
		held_until = now() + interval '2 hours' WHERE id = $1`, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE webhook_endpoint_deliveries SET suspect = true, next_attempt_at = CASE
		WHEN id = (SELECT min(id) FROM webhook_endpoint_deliveries WHERE endpoint_id = $1) THEN now() + interval '3 hours'
		ELSE (SELECT held_until FROM webhook_endpoints WHERE id = $1) END WHERE endpoint_id = $1`, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Enable(ctx, pool, "acct", a.ID); err != nil {
		t.Fatal(err)
	}
	var held, due, later, suspect int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM webhook_endpoints WHERE id = $1 AND held_until IS NOT NULL),
		count(*) FILTER (WHERE next_attempt_at <= now()), count(*) FILTER (WHERE next_attempt_at > now() + interval '150 minutes'),
		count(*) FILTER (WHERE suspect)
		FROM webhook_endpoint_deliveries WHERE endpoint_id = $1`, a.ID).Scan(&held, &due, &later, &suspect); err != nil {
		t.Fatal(err)
	}
	if held != 0 || due != 1 || later != 1 || suspect != 0 {
		t.Fatalf("after Enable: held %d, %d due, %d later, %d in the suspect lane; want 0, 1, 1, 0", held, due, later, suspect)
	}
}
