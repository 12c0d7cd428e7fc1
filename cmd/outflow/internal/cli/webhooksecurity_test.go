package cli_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

const testSecretKey = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=" // base64 of 32 bytes

// startAPI runs `serve --roles api` with env until the test ends; it
// returns the API's base URL and its stderr.
func startAPI(t *testing.T, env map[string]string, args ...string) (string, *outflowtest.LogBuffer) {
	t.Helper()
	addr := freeAddr(t)
	env["HTTP_ADDR"] = addr
	cmd := command(env, append([]string{"serve", "--roles", "api"}, args...)...)
	stderr := &outflowtest.LogBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	base := "http://" + addr
	outflowtest.WaitFor(t, 20*time.Second, "the api ready", func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return base, stderr
}

func postMerchant(t *testing.T, base, adminKey, webhookURL string) (int, map[string]any) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"name": "Shop", "webhook_url": webhookURL})
	require.NoError(t, err)
	req := authedRequest(t, http.MethodPost, base+"/v1/merchants", adminKey, b)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

// serve refuses a local webhook URL unless WEBHOOK_ALLOW_PRIVATE (or the
// flag) is set, seals secrets with OUTFLOW_SECRET_KEY, and warns once at
// start when that key is missing.
func TestServeWebhookPolicyAndSecretKey(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	ctx := context.Background()
	local := "http://127.0.0.1:9/hooks"
	admin := createKey(t, s.URL, "--admin")

	strict, strictLog := startAPI(t, map[string]string{"DATABASE_URL": s.URL})
	code, body := postMerchant(t, strict, admin, local)
	require.Equal(t, http.StatusUnprocessableEntity, code, "%v", body)
	require.Equal(t, "webhook_url", body["error"].(map[string]any)["field"])
	code, body = postMerchant(t, strict, admin, "https://shop.example/hooks")
	require.Equal(t, http.StatusCreated, code, "%v", body)
	var stored string
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT webhook_secret FROM merchants WHERE id = $1`, body["id"]).Scan(&stored))
	require.Equal(t, body["webhook_secret"], stored, "no key: stored as today")
	require.Equal(t, 1, strings.Count(strictLog.String(), "OUTFLOW_SECRET_KEY is not set"), strictLog.String())

	for _, run := range []struct {
		env  map[string]string
		args []string
	}{
		{map[string]string{"DATABASE_URL": s.URL, "WEBHOOK_ALLOW_PRIVATE": "true", "OUTFLOW_SECRET_KEY": testSecretKey}, nil},
		{map[string]string{"DATABASE_URL": s.URL, "OUTFLOW_SECRET_KEY": testSecretKey}, []string{"--webhook-allow-private"}},
	} {
		dev, devLog := startAPI(t, run.env, run.args...)
		code, body = postMerchant(t, dev, admin, local)
		require.Equal(t, http.StatusCreated, code, "%v", body)
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT webhook_secret FROM merchants WHERE id = $1`, body["id"]).Scan(&stored))
		require.True(t, strings.HasPrefix(stored, "enc:v1:"), "sealed: %s", stored)
		secret := body["webhook_secret"].(string)
		require.NotContains(t, stored, strings.TrimPrefix(secret, "whsec_"))
		require.NotContains(t, devLog.String(), "OUTFLOW_SECRET_KEY is not set")
		require.Contains(t, devLog.String(), "--webhook-allow-private is on")
	}
}

// `outflow webhook-secrets seal` needs a valid key, names the variable
// when it is wrong without echoing it, and seals what is plaintext.
func TestWebhookSecretsSealCommand(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	_, err := s.Pool.Exec(context.Background(), `
		INSERT INTO merchants (id, name, webhook_url, webhook_secret)
		SELECT gen_random_uuid(), 'M' || i, 'https://shop.example/h', 'whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI='
		FROM generate_series(1, 3) i;
		INSERT INTO webhook_endpoints (id, account_id, url, secret)
		VALUES (gen_random_uuid(), 'other', 'https://shop.example/e', 'whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI=')`)
	require.NoError(t, err)
	for _, tt := range []struct {
		key, want string
	}{
		{"", "OUTFLOW_SECRET_KEY is not set"},
		{"hunter2", "invalid OUTFLOW_SECRET_KEY: want the base64 of 32 random bytes"},
	} {
		out, err := command(map[string]string{"DATABASE_URL": s.URL, "OUTFLOW_SECRET_KEY": tt.key}, "webhook-secrets", "seal").CombinedOutput()
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr, string(out))
		require.Contains(t, string(out), tt.want)
		require.NotContains(t, string(out), "hunter2")
	}
	out, err := command(map[string]string{"DATABASE_URL": s.URL, "OUTFLOW_SECRET_KEY": testSecretKey}, "webhook-secrets", "seal").Output()
	require.NoError(t, err)
	require.Contains(t, string(out), "sealed the webhook secrets of 3 merchants and 1 other webhook endpoints")
	var plain int
	require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM merchants WHERE webhook_secret NOT LIKE 'enc:v1:%')
		+ (SELECT count(*) FROM webhook_endpoints WHERE secret NOT LIKE 'enc:v1:%')`).Scan(&plain))
	require.Zero(t, plain, "the merchants' endpoints (through the trigger) and the others")
}
