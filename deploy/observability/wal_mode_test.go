// Package observability_test checks the WAL mode's operations material
// (wal-mode-rules.yml, wal-mode-dashboard.json) against a real Prometheus
// scraping a running relay. The rest of this folder is checked by
// cmd/outflow/internal/cli's observability tests, which scrape `outflow serve`: it runs
// no relay.
package observability_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/walrelay"
)

func lookPromTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	require.NoError(t, err, "%s is not installed: run `scripts/services.sh tools` (Debian's prometheus package)", name)
	return p
}

func TestWALModeRulesPassPromtool(t *testing.T) {
	t.Parallel()
	promtool := lookPromTool(t, "promtool")
	out, err := exec.Command(promtool, "check", "rules", "wal-mode-rules.yml").CombinedOutput()
	require.NoError(t, err, "promtool check rules:\n%s", out)
}

var (
	thresholdRe = regexp.MustCompile(`(?s)^(.*\S)\s*(>=|<=|==|!=|>|<)\s*[0-9.eE+-]+\s*$`)
	alertLineRe = regexp.MustCompile(`^\s*- alert:\s*(\S+)\s*$`)
	exprLineRe  = regexp.MustCompile(`^\s*expr:\s*(.+)$`)
)

// alertQueries reads each alert's query (its expression without the
// threshold); the rules keep expressions on one line.
func alertQueries(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("wal-mode-rules.yml")
	require.NoError(t, err)
	out := map[string]string{}
	alert := ""
	for _, line := range strings.Split(string(b), "\n") {
		if m := alertLineRe.FindStringSubmatch(line); m != nil {
			alert = m[1]
			continue
		}
		m := exprLineRe.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		q := thresholdRe.FindStringSubmatch(strings.TrimSpace(m[1]))
		require.NotNil(t, q, "alert %s: expression %q is not \"<query> <op> <number>\"", alert, m[1])
		out["alert "+alert] = q[1]
	}
	require.NotEmpty(t, out)
	return out
}

func dashboardQueries(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("wal-mode-dashboard.json")
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	require.NoError(t, json.Unmarshal(b, &d))
	out := map[string]string{}
	for _, p := range d.Panels {
		for i, tg := range p.Targets {
			out[fmt.Sprintf("panel %q target %d", p.Title, i)] = tg.Expr
		}
	}
	require.NotEmpty(t, out)
	return out
}

// okBroker acknowledges everything.
type okBroker struct{}

func (okBroker) Publish(_ context.Context, msgs []forwarder.Outgoing) []error {
	return make([]error, len(msgs))
}

type placed struct{}

func (placed) EventType() string { return "order.placed" }

// Every dashboard query and every alert's query must evaluate and return
// series against a Prometheus scraping a relay that relayed events.
func TestWALModeQueriesAgainstPrometheus(t *testing.T) {
	t.Parallel()
	prom := lookPromTool(t, "prometheus")
	queries := dashboardQueries(t)
	for k, v := range alertQueries(t) {
		queries[k] = v
	}

	pg := testservers.StartLogicalPostgres(t)
	reg := prometheus.NewRegistry()
	r, err := walrelay.New(walrelay.Config{Pool: pg.Pool, Broker: okBroker{}, Registerer: reg, StatsInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() { require.NoError(t, r.Close()); require.NoError(t, <-done) })
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)

	ctx := context.Background()
	outflowtest.WaitFor(t, 20*time.Second, "the slot", func() bool { return r.Leader() && r.Ready() == nil })
	w, err := outbox.NewWriter(outbox.Config{Mode: outbox.ModeWAL})
	require.NoError(t, err)
	write := func(v int64) {
		ev, err := events.New(ctx, events.Aggregate{Type: "order", ID: "o1", Version: v}, placed{})
		require.NoError(t, err)
		tx, err := pg.Pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, w.PublishTx(ctx, tx, ev))
		require.NoError(t, tx.Commit(ctx))
	}

	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	target := strings.TrimPrefix(srv.URL, "http://")
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: outflow-relay
    static_configs:
      - targets: [%q]
`, target)), 0o600))
	promAddr := freeAddr(t)
	cmd := exec.Command(prom, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+promAddr)
	promLog := &outflowtest.LogBuffer{}
	cmd.Stdout, cmd.Stderr = promLog, promLog
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })

	type result struct {
		Status, ErrorType, Error string
		Data                     struct{ Result []json.RawMessage }
	}
	query := func(q string) (result, error) {
		resp, err := http.Get("http://" + promAddr + "/api/v1/query?query=" + url.QueryEscape(q))
		if err != nil {
			return result{}, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var r result
		if err := json.Unmarshal(b, &r); err != nil {
			return result{}, fmt.Errorf("status %d: %s", resp.StatusCode, b)
		}
		return r, nil
	}
	var failing []string
	deadline := time.Now().Add(60 * time.Second)
	for v := int64(1); ; v++ {
		write(v) // a flow of events, so the rates have samples
		failing = failing[:0]
		for name, q := range queries {
			r, err := query(q)
			switch {
			case err != nil:
				failing = append(failing, fmt.Sprintf("%s: %s: %v", name, q, err))
			case r.Status != "success":
				t.Fatalf("%s: %s: %s: %s", name, q, r.ErrorType, r.Error)
			case len(r.Data.Result) == 0:
				failing = append(failing, fmt.Sprintf("%s: %s: empty result", name, q))
			}
		}
		if len(failing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond) // polling interval, not a guess at readiness
	}
	require.Empty(t, failing, "queries that returned nothing (prometheus log:\n%s)", promLog.String())
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}
