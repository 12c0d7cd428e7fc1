package cli_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// startServe runs `outflow serve` with args and waits until its API is
// ready; it returns the API's address.
func startServe(t *testing.T, env map[string]string, args ...string) (addr string, stderr *outflowtest.LogBuffer) {
	t.Helper()
	addr = freeAddr(t)
	env["HTTP_ADDR"] = addr
	cmd := command(env, append([]string{"serve"}, args...)...)
	stderr = &outflowtest.LogBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	outflowtest.WaitFor(t, 20*time.Second, "serve ready", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return addr, stderr
}

// /metrics is served on --metrics-addr, not on the API's address.
func TestServeMetricsOnItsOwnAddress(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	metrics := freeAddr(t)
	api, stderr := startServe(t, map[string]string{"DATABASE_URL": s.URL}, "--metrics-addr", metrics)
	require.Contains(t, stderr.String(), "serving metrics")

	// With an admin key, so that the answer is the router's, not the 401
	// every unauthenticated request gets.
	resp, err := http.DefaultClient.Do(authedRequest(t, http.MethodGet, "http://"+api+"/metrics", createKey(t, s.URL, "--admin"), nil))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "%s", body)

	resp, err = http.Get("http://" + metrics + "/metrics")
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(body), "go_goroutines")

	out, err := command(map[string]string{"DATABASE_URL": s.URL}, "serve", "--idle-timeout", "0s").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "invalid --idle-timeout")
}

// A client that trickles its headers or its body, or holds an idle
// keep-alive connection, is cut off within the configured timeouts, and
// nothing it sent is written.
func TestServeCutsOffSlowAndIdleClients(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	api, _ := startServe(t, map[string]string{"DATABASE_URL": s.URL},
		"--read-header-timeout", "1s", "--read-timeout", "2s", "--idle-timeout", "1s")
	admin := createKey(t, s.URL, "--admin")
	merchants := func() (n int) {
		require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM merchants`).Scan(&n))
		return n
	}

	// trickle sends head at once, then rest a byte a second, and returns
	// how long until the server answered or closed the connection.
	trickle := func(t *testing.T, head, rest string) (time.Duration, string) {
		conn, err := net.Dial("tcp", api)
		require.NoError(t, err)
		defer conn.Close()
		start := time.Now()
		_, err = io.WriteString(conn, head)
		require.NoError(t, err)
		answered := make(chan string, 1)
		go func() {
			b, _ := io.ReadAll(conn) // until the server closes it
			answered <- string(b)
		}()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case got := <-answered:
				return time.Since(start), got
			case <-tick.C:
				if i < len(rest) {
					_, _ = conn.Write([]byte{rest[i]}) // fails once the server has closed
				}
			}
			require.Less(t, time.Since(start), 15*time.Second, "the slow client is still connected")
		}
	}

	t.Run("body a byte a second", func(t *testing.T) {
		body := `{"name":"Slow Shop","webhook_url":"https://slow.example/h"}`
		// Authenticated, so that the server waits for the body rather than
		// answering 401 after the headers.
		took, got := trickle(t, fmt.Sprintf("POST /v1/merchants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", admin, len(body)), body)
		require.Less(t, took, 6*time.Second, "cut off after --read-timeout")
		if got != "" {
			require.Contains(t, got, "400", "a cut-off body is refused: %s", got)
		}
		require.Zero(t, merchants(), "nothing of the cut-off request is written")
	})
	t.Run("headers a byte a second", func(t *testing.T) {
		took, _ := trickle(t, "GET /healthz HTTP/1.1\r\n", "Host: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n")
		require.Less(t, took, 5*time.Second, "cut off after --read-header-timeout")
	})
	t.Run("idle keep-alive", func(t *testing.T) {
		conn, err := net.Dial("tcp", api)
		require.NoError(t, err)
		defer conn.Close()
		_, err = io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		idleSince := time.Now()
		require.NoError(t, conn.SetReadDeadline(idleSince.Add(10*time.Second)))
		_, err = br.ReadByte() // blocks until the server closes the idle connection
		require.ErrorIs(t, err, io.EOF, "the server closes an idle connection")
		require.Less(t, time.Since(idleSince), 5*time.Second, "closed after --idle-timeout")
	})
	require.Zero(t, merchants())
}
