package appmigrations_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks/secretseal"
)

// endpoint is a webhook_endpoints row as the migration and its trigger
// write it.
type endpoint struct {
	AccountID, URL, Description, Secret string
	EventTypes                          []string
	Previous                            *string
	PreviousExpires                     *time.Time
}

func readEndpoint(t *testing.T, s *outflowtest.Schema, id string) (endpoint, bool) {
	t.Helper()
	var e endpoint
	err := s.Pool.QueryRow(context.Background(), `SELECT account_id, url, description, secret, event_types, previous_secret, previous_secret_expires_at
		FROM webhook_endpoints WHERE id = $1`, id).Scan(&e.AccountID, &e.URL, &e.Description, &e.Secret, &e.EventTypes, &e.Previous, &e.PreviousExpires)
	if errors.Is(err, pgx.ErrNoRows) {
		return endpoint{}, false
	}
	require.NoError(t, err)
	return e, true
}

// service is the app's service as an API process of the release before
// 00034 runs it: it writes merchants, and knows nothing of endpoints.
func service(t *testing.T, s *outflowtest.Schema, key *secretseal.Key) *app.Service {
	t.Helper()
	w, err := outbox.NewWriter(outbox.Config{Routes: app.Routes})
	require.NoError(t, err)
	svc, err := app.NewService(app.Config{Pool: s.Pool, Events: w, AllowPrivateWebhooks: true, SecretKey: key,
		WebhookSecretGrace: time.Hour})
	require.NoError(t, err)
	return svc
}

// 00034 on a database whose merchants were made before it (plaintext
// secrets, sealed ones, one in its rotation's grace period): each gets one
// endpoint, its id the merchant's, for every event type, with its URL and
// secrets as stored, and a sealed secret opens with the endpoint id as
// associated data. While API processes of the earlier release still run,
// the trigger brings their writes to the endpoint: a merchant created, a
// URL changed, a secret rotated or sealed; it never makes again an
// endpoint the merchant deleted, and never overwrites with a URL what the
// endpoints API set when only a secret changed. A down leaves the
// endpoints and stops the copying; an up again copies nothing twice.
func TestMerchantWebhookEndpointsMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t) // the framework's set
	// The app's set as the release before 00034 applied it.
	p, err := goose.NewProvider(goose.DialectPostgres, s.OpenDB(t), appmigrations.Set().FS,
		goose.WithTableName(appmigrations.VersionTable), goose.WithDisableGlobalRegistry(true),
		goose.WithSlog(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 33)
	require.NoError(t, err)

	key, err := secretseal.ParseKey(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)))
	require.NoError(t, err)
	plain, sealing := service(t, s, nil), service(t, s, key)
	a, err := plain.CreateMerchant(ctx, app.NewMerchant{Name: "plain", WebhookURL: "https://a.example/hook"})
	require.NoError(t, err)
	b, err := sealing.CreateMerchant(ctx, app.NewMerchant{Name: "sealed", WebhookURL: "https://b.example/hook"})
	require.NoError(t, err)
	c, err := sealing.CreateMerchant(ctx, app.NewMerchant{Name: "rotating", WebhookURL: "https://c.example/hook"})
	require.NoError(t, err)
	rotated, err := sealing.RotateWebhookSecret(ctx, c.ID)
	require.NoError(t, err)
	require.NotNil(t, rotated.PreviousSecretExpiresAt)
	var none bool
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT to_regclass('webhook_endpoints') IS NULL`).Scan(&none))
	require.True(t, none, "before the upgrade")

	_, err = appmigrations.Up(ctx, s.OpenDB(t))
	require.NoError(t, err)

	opens := func(stored, id, want string) {
		t.Helper()
		got, err := secretseal.Open(key, stored, id)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	ea, ok := readEndpoint(t, s, a.ID)
	require.True(t, ok)
	require.Equal(t, endpoint{AccountID: a.ID, URL: "https://a.example/hook", Description: "webhook_url of the merchant",
		Secret: a.WebhookSecret, EventTypes: []string{}}, ea, "a plaintext secret as stored; every event type")
	eb, ok := readEndpoint(t, s, b.ID)
	require.True(t, ok)
	require.True(t, secretseal.Sealed(eb.Secret))
	opens(eb.Secret, b.ID, b.WebhookSecret)
	ec, ok := readEndpoint(t, s, c.ID)
	require.True(t, ok)
	opens(ec.Secret, c.ID, rotated.WebhookSecret)
	require.NotNil(t, ec.Previous, "the rotated-out secret keeps its grace")
	opens(*ec.Previous, c.ID, c.WebhookSecret)
	require.WithinDuration(t, *rotated.PreviousSecretExpiresAt, *ec.PreviousExpires, time.Millisecond)
	var endpoints int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoints`).Scan(&endpoints))
	require.Equal(t, 3, endpoints, "one per merchant")

	// The earlier release's API during the rollout.
	d, err := sealing.CreateMerchant(ctx, app.NewMerchant{Name: "new", WebhookURL: "https://d.example/hook"})
	require.NoError(t, err)
	ed, ok := readEndpoint(t, s, d.ID)
	require.True(t, ok, "a merchant created by the old API gets its endpoint")
	opens(ed.Secret, d.ID, d.WebhookSecret)
	_, err = s.Pool.Exec(ctx, `UPDATE merchants SET webhook_url = 'https://a2.example/hook' WHERE id = $1`, a.ID)
	require.NoError(t, err)
	ea, _ = readEndpoint(t, s, a.ID)
	require.Equal(t, "https://a2.example/hook", ea.URL, "a URL changed by the old API")
	n, err := app.SealWebhookSecrets(ctx, s.Pool, key, 10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	ea, _ = readEndpoint(t, s, a.ID)
	opens(ea.Secret, a.ID, a.WebhookSecret) // sealed with the merchant id: the endpoint's
	// The endpoints API changed b's URL; the old API rotates its secret.
	_, err = s.Pool.Exec(ctx, `UPDATE webhook_endpoints SET url = 'https://b2.example/hook' WHERE id = $1`, b.ID)
	require.NoError(t, err)
	rb, err := sealing.RotateWebhookSecret(ctx, b.ID)
	require.NoError(t, err)
	eb, _ = readEndpoint(t, s, b.ID)
	require.Equal(t, "https://b2.example/hook", eb.URL, "only what changed reaches the endpoint")
	opens(eb.Secret, b.ID, rb.WebhookSecret)
	opens(*eb.Previous, b.ID, b.WebhookSecret)
	// c deleted its endpoint through the endpoints API.
	_, err = s.Pool.Exec(ctx, `DELETE FROM webhook_endpoints WHERE id = $1`, c.ID)
	require.NoError(t, err)
	_, err = sealing.RotateWebhookSecret(ctx, c.ID)
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `UPDATE merchants SET webhook_url = 'https://c2.example/hook' WHERE id = $1`, c.ID)
	require.NoError(t, err)
	_, ok = readEndpoint(t, s, c.ID)
	require.False(t, ok, "a deleted endpoint is not made again")

	// Down: the endpoints stay, the trigger goes; up again copies what
	// has no endpoint yet and leaves the rest as they are.
	db := s.OpenDB(t)
	r, err := appmigrations.Down(ctx, db)
	require.NoError(t, err)
	require.EqualValues(t, 34, r.Version)
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoints`).Scan(&endpoints))
	require.Equal(t, 3, endpoints, "the down leaves the endpoints")
	e, err := plain.CreateMerchant(ctx, app.NewMerchant{Name: "after down", WebhookURL: "https://e.example/hook"})
	require.NoError(t, err)
	_, ok = readEndpoint(t, s, e.ID)
	require.False(t, ok, "no trigger after the down")
	_, err = appmigrations.Up(ctx, db)
	require.NoError(t, err)
	_, ok = readEndpoint(t, s, e.ID)
	require.True(t, ok)
	eb, _ = readEndpoint(t, s, b.ID)
	require.Equal(t, "https://b2.example/hook", eb.URL, "an endpoint already there is left as it is")
	_, ok = readEndpoint(t, s, c.ID)
	require.True(t, ok, "a merchant without any endpoint when the up runs gets one (documented)")
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoints`).Scan(&endpoints))
	require.Equal(t, 5, endpoints)

	// Each statement can run again (NO TRANSACTION: a run that failed part
	// way is not recorded, and the next one runs the file from the start).
	_, err = s.Pool.Exec(ctx, `DELETE FROM `+appmigrations.VersionTable+` WHERE version_id = 34`)
	require.NoError(t, err)
	rs, err := appmigrations.Up(ctx, db)
	require.NoError(t, err)
	require.Len(t, rs, 1)
	require.EqualValues(t, 34, rs[0].Version)
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoints`).Scan(&endpoints))
	require.Equal(t, 5, endpoints, "nothing copied twice")
	var triggers int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'merchants'::regclass AND NOT tgisinternal`).Scan(&triggers))
	require.Equal(t, 2, triggers, "insert and update, once each")
}

// 00034 lets a legacy delivery be 'moved'; its down narrows the CHECK
// again only when no delivery is moved (it would not hold), and an up
// after either down works.
func TestMovedDeliveriesMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	db := s.OpenDB(t)
	insert := func(status string) error {
		_, err := s.Pool.Exec(ctx, `INSERT INTO webhook_deliveries (message_id, merchant_id, url, event_type, body, status)
			VALUES (gen_random_uuid(), gen_random_uuid(), 'https://x.example', 'payment.paid', '{}', $1)`, status)
		return err
	}
	require.NoError(t, insert("moved"))
	require.Error(t, insert("lost"), "the CHECK still holds")
	down := func() {
		t.Helper()
		r, err := appmigrations.Down(ctx, db)
		require.NoError(t, err)
		require.EqualValues(t, 34, r.Version)
	}
	down()
	require.NoError(t, insert("moved"), "moved rows exist: the CHECK keeps 'moved'")
	_, err := appmigrations.Up(ctx, db)
	require.NoError(t, err)
	_, err = s.Pool.Exec(ctx, `DELETE FROM webhook_deliveries`)
	require.NoError(t, err)
	down()
	require.Error(t, insert("moved"), "none moved: the CHECK is the earlier release's again")
	require.NoError(t, insert("dead"))
	_, err = appmigrations.Up(ctx, db)
	require.NoError(t, err)
	require.NoError(t, insert("moved"))
}
