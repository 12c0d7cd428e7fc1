package cli_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

type readyBody struct {
	Ready    bool              `json:"ready"`
	NotReady []string          `json:"not_ready"`
	Checks   map[string]string `json:"checks"`
}

// getReady returns /readyz's status and body; status 0 when unreachable.
func getReady(t *testing.T, addr string) (int, readyBody) {
	t.Helper()
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, readyBody{}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var b readyBody
	require.NoError(t, json.Unmarshal(raw, &b), "/readyz body is JSON: %s", raw)
	return resp.StatusCode, b
}

// waitReady polls /readyz until it answers status and, on 503, names
// every one of notReady.
func waitReady(t *testing.T, exited <-chan struct{}, stderr *outflowtest.LogBuffer, addr string, status int, notReady ...string) readyBody {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var (
		got  int
		body readyBody
	)
	for {
		got, body = getReady(t, addr)
		if got == status && containsAll(body.NotReady, notReady) {
			return body
		}
		select {
		case <-exited:
			t.Fatalf("the process exited: %s", stderr.String())
		default:
		}
		require.True(t, time.Now().Before(deadline), "/readyz never answered %d naming %v: last %d %+v\n%s",
			status, notReady, got, body, stderr.String())
		time.Sleep(50 * time.Millisecond) // polling a condition, with a deadline
	}
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			found = found || h == w
		}
		if !found {
			return false
		}
	}
	return true
}

// Each role's /readyz is 200 when the database and the broker answer and
// its role works, and 503 naming the broker, then the database, when they
// are gone; /healthz stays 200 throughout.
func TestReadyzPerRole(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		args   []string
		checks []string
	}{
		{"forward", []string{"forward", "--takeover-after", "2s"}, []string{"database", "broker", "forwarder"}},
		{"worker", []string{"worker"}, []string{"database", "broker", "worker"}},
		{"serve", []string{"serve", "--roles", "api,forwarder,worker", "--takeover-after", "2s"}, []string{"database", "broker", "forwarder", "worker"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := outflowtest.NewSchema(t, appmigrations.Sets()...)
			redis := testservers.StartRedis(t)
			u, err := url.Parse(s.URL)
			require.NoError(t, err)
			pg := testservers.StartProxy(t, u.Host)
			u.Host = pg.Addr
			metrics := freeAddr(t)
			cmd := command(map[string]string{"DATABASE_URL": u.String(), "REDIS_URL": redis.URL, "HTTP_ADDR": freeAddr(t),
				"METRICS_ADDR": metrics, "LOG_FORMAT": "json"}, tc.args...)
			var stderr outflowtest.LogBuffer
			cmd.Stderr = &stderr
			require.NoError(t, cmd.Start())
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()

			body := waitReady(t, exited, &stderr, metrics, http.StatusOK)
			for _, c := range tc.checks {
				require.Equal(t, "ok", body.Checks[c], "check %s in %+v", c, body)
			}

			redis.Stop()
			body = waitReady(t, exited, &stderr, metrics, http.StatusServiceUnavailable, "broker")
			require.NotContains(t, body.NotReady, "database")
			resp, err := http.Get("http://" + metrics + "/healthz")
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode, "alive while the broker is down")

			redis.Start()
			waitReady(t, exited, &stderr, metrics, http.StatusOK)

			pg.Stop()
			body = waitReady(t, exited, &stderr, metrics, http.StatusServiceUnavailable, "database")
			require.NotContains(t, body.NotReady, "broker")
			pg.Start()

			require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
			select {
			case <-exited:
			case <-time.After(30 * time.Second):
				t.Fatalf("no exit after SIGTERM: %s", stderr.String())
			}
			// LOG_FORMAT=json: every line of stderr is one JSON object.
			lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
			require.NotEmpty(t, lines)
			for _, l := range lines {
				var v map[string]any
				require.NoError(t, json.Unmarshal([]byte(l), &v), "stderr line is not JSON: %q", l)
				require.Contains(t, v, "msg")
			}
		})
	}
}
