package cli_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// --max-event-bytes (and MAX_EVENT_BYTES): a bad value is refused before
// anything starts, naming its source; a good one reaches the api role's
// outbox writer, whose refusal is the API's 413.
func TestServeMaxEventBytes(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		env  map[string]string
		args string
		want string
	}{
		{nil, "serve --max-event-bytes 10", "invalid --max-event-bytes: 10 bytes is less than an event's envelope"},
		{nil, "serve --max-event-bytes lots", `invalid argument "lots" for "--max-event-bytes" flag`},
		{map[string]string{"MAX_EVENT_BYTES": "1MB"}, "serve", "invalid MAX_EVENT_BYTES"},
		{map[string]string{"MAX_EVENT_BYTES": "100"}, "serve", "invalid MAX_EVENT_BYTES: 100 bytes"},
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

	// The flag wins over the environment, and reaches the writer: no
	// payment event fits 300 bytes.
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	addr := freeAddr(t)
	cmd := command(map[string]string{"DATABASE_URL": s.URL, "HTTP_ADDR": addr, "MAX_EVENT_BYTES": "-1"},
		"serve", "--max-event-bytes", "300")
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
	post := func(path, body string) (int, []byte) {
		t.Helper()
		resp, err := http.DefaultClient.Do(authedRequest(t, http.MethodPost, base+path, key, []byte(body)))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, b
	}
	status, body := post("/v1/merchants", `{"name": "Acme", "webhook_url": "https://acme.example/hooks"}`)
	require.Equal(t, http.StatusCreated, status, "%s %s", body, stderr.String())
	var m struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(body, &m))
	status, body = post("/v1/payments", `{"merchant_id": "`+m.ID+`", "amount": 100, "currency": "EUR"}`)
	require.Equal(t, http.StatusRequestEntityTooLarge, status, "%s", body)
	require.Contains(t, string(body), `"code":"event_too_large"`)
	require.Contains(t, string(body), "over the limit of 300")
}
