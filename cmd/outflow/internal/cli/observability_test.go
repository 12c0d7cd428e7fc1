package cli_test

import (
	"encoding/json"
	"fmt"
	"io"
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

	"github.com/stretchr/testify/require"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// The operations material lives in deploy/observability, next to nothing
// else deployable, so that one folder can be handed to an operator.
const observabilityDir = "../../../../deploy/observability"

// lookPromTool finds a Prometheus binary or fails saying how to get it.
func lookPromTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	require.NoError(t, err, "%s is not installed: run `scripts/services.sh tools` (Debian's prometheus package)", name)
	return p
}

// thresholdRe splits an alert expression "<query> <op> <number>" so that the
// query can be evaluated on its own: with nothing wrong, the whole
// expression rightly returns nothing, but the query must still return series.
var thresholdRe = regexp.MustCompile(`(?s)^(.*\S)\s*(>=|<=|==|!=|>|<)\s*[0-9.eE+-]+\s*$`)

var (
	alertLineRe = regexp.MustCompile(`^\s*- alert:\s*(\S+)\s*$`)
	exprLineRe  = regexp.MustCompile(`^\s*expr:\s*(.+)$`)
)

// readAlertQueries reads each alert's query; the rules keep their
// expressions on one line, which spares the module a YAML dependency.
func readAlertQueries(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(observabilityDir, "prometheus-rules.yml"))
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
		require.NotEmpty(t, alert, "expr before any alert: %s", line)
		e := strings.TrimSpace(m[1])
		require.NotContains(t, []string{"|", ">", "|-", ">-"}, e, "alert %s: keep the expression on one line", alert)
		q := thresholdRe.FindStringSubmatch(e)
		require.NotNil(t, q, "alert %s: expression %q is not \"<query> <op> <number>\"", alert, e)
		out["alert "+alert] = q[1]
		alert = ""
	}
	require.NotEmpty(t, out, "no alert rules")
	return out
}

type dashPanel struct {
	Title   string
	Targets []struct{ Expr string }
	Panels  []dashPanel
}

func readDashboardQueries(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(observabilityDir, "grafana-dashboard.json"))
	require.NoError(t, err)
	var d struct{ Panels []dashPanel }
	require.NoError(t, json.Unmarshal(b, &d))
	out := map[string]string{}
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			for i, tg := range p.Targets {
				out[fmt.Sprintf("panel %q target %d", p.Title, i)] = tg.Expr
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	require.NotEmpty(t, out, "no dashboard queries")
	return out
}

func TestPrometheusRulesPassPromtool(t *testing.T) {
	t.Parallel()
	promtool := lookPromTool(t, "promtool")
	out, err := exec.Command(promtool, "check", "rules", filepath.Join(observabilityDir, "prometheus-rules.yml")).CombinedOutput()
	require.NoError(t, err, "promtool check rules:\n%s", out)
}

// A real Prometheus scrapes a running Outflow that handled a few payments;
// every dashboard query and every alert's query (its expression without
// the threshold) must evaluate without error and return series.
func TestDashboardAndAlertQueriesAgainstPrometheus(t *testing.T) {
	t.Parallel()
	prom := lookPromTool(t, "prometheus")
	queries := readDashboardQueries(t)
	for k, v := range readAlertQueries(t) {
		queries[k] = v
	}

	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	redisSrv := testservers.StartRedis(t)
	metrics := freeAddr(t)
	// The merchants' endpoints: one accepts its webhooks, the other fails
	// them, so the webhook panels and the failure-rate alert have both
	// outcomes to show.
	hooks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/fail") {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(hooks.Close)
	api, stderr := startServe(t, map[string]string{"DATABASE_URL": s.URL, "REDIS_URL": redisSrv.URL, "WEBHOOK_ALLOW_PRIVATE": "true"},
		"--roles", "api,forwarder,worker", "--metrics-addr", metrics)

	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: outflow
    static_configs:
      - targets: [%q]
`, metrics)), 0o600))
	promAddr := freeAddr(t)
	cmd := exec.Command(prom, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promAddr)
	promLog := &outflowtest.LogBuffer{}
	cmd.Stdout, cmd.Stderr = promLog, promLog
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })

	key := createKey(t, s.URL, "--admin")
	post := func(path string, body any) map[string]any {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(authedRequest(t, http.MethodPost, "http://"+api+path, key, b))
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Less(t, resp.StatusCode, 300, "POST %s: %s", path, stderr.String())
		var out map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return out
	}
	for _, hook := range []string{"/ok", "/fail"} {
		m := post("/v1/merchants", map[string]any{"name": "Ops" + hook, "webhook_url": hooks.URL + hook})
		for i := 1; i <= 3; i++ {
			post("/v1/payments", map[string]any{"merchant_id": m["id"], "amount": 100 * i, "currency": "EUR"})
		}
	}

	type result struct {
		Status    string
		ErrorType string
		Error     string
		Data      struct{ Result []json.RawMessage }
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
	outflowtest.WaitFor(t, 30*time.Second, "Prometheus scraped Outflow", func() bool {
		r, err := query(`up{job="outflow"} == 1`)
		return err == nil && len(r.Data.Result) > 0
	})

	// rate() needs two samples of a series after it first appears, so the
	// queries are retried until they all return series or time runs out.
	var failing []string
	deadline := time.Now().Add(45 * time.Second)
	for {
		failing = failing[:0]
		for name, q := range queries {
			r, err := query(q)
			switch {
			case err != nil:
				failing = append(failing, fmt.Sprintf("%s: %s: %v", name, q, err))
			case r.Status != "success":
				// An error will not fix itself: fail now.
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
