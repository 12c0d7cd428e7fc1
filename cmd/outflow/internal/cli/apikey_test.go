package cli_test

import (
	"bytes"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

var keyLine = regexp.MustCompile(`^ofk_[A-Za-z0-9_-]{43}\n$`)

// createKey runs `outflow apikey create args...` and returns the key,
// checking that stdout holds it and nothing else.
func createKey(t *testing.T, dbURL string, args ...string) string {
	t.Helper()
	cmd := command(map[string]string{"DATABASE_URL": dbURL}, append([]string{"apikey", "create"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s", stderr.String())
	require.Regexp(t, keyLine, string(out), "stdout holds the key and nothing else")
	return strings.TrimSpace(string(out))
}

// authedRequest is an HTTP request with the key.
func authedRequest(t *testing.T, method, url, key string, body []byte) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	return req
}

func TestAPIKeyCommands(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	env := map[string]string{"DATABASE_URL": s.URL}
	run := func(args ...string) string {
		t.Helper()
		out, err := command(env, args...).Output()
		require.NoError(t, err, "%v", args)
		return string(out)
	}
	require.Contains(t, run("apikey", "list"), "no API keys")

	key := createKey(t, s.URL, "--admin", "--name", "ops")
	other := createKey(t, s.URL, "--admin")
	require.NotEqual(t, key, other)
	var id, merchant string
	require.NoError(t, s.Pool.QueryRow(t.Context(), `SELECT id::text FROM api_keys WHERE name = 'ops'`).Scan(&id))
	require.NoError(t, s.Pool.QueryRow(t.Context(), `INSERT INTO merchants (id, name, webhook_url, webhook_secret)
		VALUES (gen_random_uuid(), 'M', 'https://m.example/h', 's') RETURNING id::text`).Scan(&merchant))
	createKey(t, s.URL, "--merchant", strings.ToUpper(merchant), "--name", "shop")

	list := run("apikey", "list")
	require.Regexp(t, regexp.MustCompile(id+`\s+`+regexp.QuoteMeta(key[:12])+`\s+ops\s+\(admin\)\s+\S+\s+-\s+-`), list)
	require.Regexp(t, `\s+shop\s+`+merchant+`\s`, list)
	require.NotContains(t, list, key, "never the key itself")
	require.Len(t, strings.Split(strings.TrimSpace(list), "\n"), 4, "a header and three keys")

	require.Contains(t, run("apikey", "revoke", id), "revoked "+id)
	require.Regexp(t, regexp.MustCompile(id+`.*\d{4}-\d\d-\d\dT\S+\s*$`), strings.Split(run("apikey", "list"), "\n")[1], "the revocation time")
	var revoked int
	require.NoError(t, s.Pool.QueryRow(t.Context(), `SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL`).Scan(&revoked))
	require.Equal(t, 1, revoked)

	for args, want := range map[string]string{
		"apikey create": "give exactly one of --admin and --merchant",
		"apikey create --admin --merchant " + merchant: "give exactly one of --admin and --merchant",
		"apikey create --merchant nope":                "invalid --merchant",
		"apikey create --merchant " + uuid.NewString(): "invalid --merchant: no merchant",
		"apikey revoke " + uuid.NewString():            "no API key with id",
		"apikey revoke nope":                           "no API key with id",
		"apikey revoke":                                "accepts 1 arg",
	} {
		cmd := command(env, strings.Fields(args)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr, args)
		require.Empty(t, out, "%s: nothing on stdout", args)
		require.Contains(t, stderr.String(), want, args)
	}
	out, err := command(env, "apikey", "create", "--admin", "--name", "bad\x01name").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "control characters")
}

func TestServeRateLimitFlags(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		env  map[string]string
		args string
		want string
	}{
		{nil, "serve --rate-limit -1", "invalid --rate-limit"},
		{nil, "serve --rate-burst 0", "invalid --rate-burst"},
		{map[string]string{"RATE_LIMIT": "fast"}, "serve", "invalid RATE_LIMIT"},
		{map[string]string{"RATE_BURST": "0"}, "serve", "invalid RATE_BURST"},
	} {
		env := map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/none"} // checked before connecting
		for k, v := range tt.env {
			env[k] = v
		}
		out, err := command(env, strings.Fields(tt.args)...).CombinedOutput()
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr, tt.args)
		require.Contains(t, string(out), tt.want, tt.args)
	}

	// The flag reaches the API: a burst of 2, then 429 with Retry-After;
	// RATE_LIMIT=0 in the environment is overridden by the flag.
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	addr := freeAddr(t)
	cmd := command(map[string]string{"DATABASE_URL": s.URL, "HTTP_ADDR": addr, "RATE_LIMIT": "0"},
		"serve", "--rate-limit", "0.01", "--rate-burst", "2")
	var stderr outflowtest.LogBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	base := "http://" + addr
	outflowtest.WaitFor(t, 20*time.Second, "the api ready", func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	key := createKey(t, s.URL, "--admin")
	var statuses []int
	var retry string
	for range 3 {
		resp, err := http.DefaultClient.Do(authedRequest(t, http.MethodGet, base+"/v1/merchants/"+uuid.NewString(), key, nil))
		require.NoError(t, err)
		resp.Body.Close()
		statuses = append(statuses, resp.StatusCode)
		retry = resp.Header.Get("Retry-After")
	}
	require.Equal(t, []int{404, 404, 429}, statuses, "%s", stderr.String())
	require.Equal(t, "100", retry)
}
