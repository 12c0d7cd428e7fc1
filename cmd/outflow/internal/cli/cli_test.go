package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/stretchr/testify/require"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
	webhookschema "github.com/outflow-dev/outflow/webhooks/schema"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outflow-cli-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "outflow")
	out, err := exec.Command("go", "build", "-o", binary, "github.com/outflow-dev/outflow/cmd/outflow").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build outflow: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func command(env map[string]string, args ...string) *exec.Cmd {
	cmd := exec.Command(binary, args...)
	// A free port for each process's /metrics (it says which in its log),
	// so that the tests' processes run side by side; a test's own env or
	// --metrics-addr overrides it.
	cmd.Env = append(os.Environ(), "LOG_LEVEL=info", "METRICS_ADDR=127.0.0.1:0")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return cmd
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

func TestBadConfigNamesTheSource(t *testing.T) {
	t.Parallel()
	tests := []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{"LOG_LEVEL": "loud"}, []string{"migrate", "status"}, "invalid LOG_LEVEL"},
		{nil, []string{"--http-addr", "nope", "serve"}, "invalid --http-addr"},
		{map[string]string{"DATABASE_URL": "mysql://x"}, []string{"migrate", "up"}, "invalid DATABASE_URL"},
		{nil, []string{"serve", "--roles", "api,teleporter"}, `unknown role "teleporter"`},
	}
	for _, tt := range tests {
		out, err := command(tt.env, tt.args...).CombinedOutput()
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr, "%v", tt.args)
		require.Contains(t, string(out), tt.want)
	}
}

func TestMigrateCommands(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewEmptySchema(t)
	env := map[string]string{"DATABASE_URL": s.URL}
	run := func(args ...string) string {
		out, err := command(env, args...).CombinedOutput()
		require.NoError(t, err, "%v: %s", args, out)
		return string(out)
	}
	newest := func(fsys fs.FS) string {
		names, err := fs.Glob(fsys, "*.sql")
		require.NoError(t, err)
		n := names[len(names)-1]
		version, _, _ := strings.Cut(n, "_") // goose prints the version, which a reserved number may skip
		return strings.TrimLeft(version, "0") + " " + n
	}
	lastFramework, lastApp := newest(migrations.FS()), newest(appmigrations.Set().FS)
	app := []string{"--set", "outflow", "--set", "app"}
	up := run(append([]string{"migrate", "up"}, app...)...)
	require.Contains(t, up, "applied outflow 1 00001_outbox.sql")
	require.Contains(t, up, "applied app 2 00002_payments.sql")
	require.Less(t, strings.Index(up, "applied outflow "+lastFramework), strings.Index(up, "applied webhooks 1 00001_webhooks.sql"),
		"the framework's set runs first")
	require.Less(t, strings.Index(up, "applied webhooks 1 "), strings.Index(up, "applied app 2 "),
		"the webhook package's set runs before the app's, unnamed")
	require.Contains(t, run(append([]string{"migrate", "up"}, app...)...), "schema is up to date")
	require.NotContains(t, run(append([]string{"migrate", "status"}, app...)...), "pending")
	require.Regexp(t, `webhooks\s+1\s+00001_webhooks.sql\s+applied`, run(append([]string{"migrate", "status"}, app...)...))
	// The webhook package's set alone, as a service other than the app
	// names it: rolled back and applied again.
	require.Contains(t, run("migrate", "down", "--set", "app"), "rolled back app "+lastApp)
	lastWebhooks := newest(webhookschema.Set().FS)
	require.Contains(t, run("migrate", "down", "--set", "webhooks"), "rolled back webhooks "+lastWebhooks)
	version, file, _ := strings.Cut(lastWebhooks, " ")
	require.Regexp(t, `webhooks\s+`+version+`\s+`+regexp.QuoteMeta(file)+`\s+pending`, run("migrate", "status", "--set", "webhooks"))
	require.Contains(t, run("migrate", "up", "--set", "webhooks"), "applied webhooks "+lastWebhooks)
	require.Contains(t, run(append([]string{"migrate", "up"}, app...)...), "applied app "+lastApp)
	// down takes the one set named.
	require.Contains(t, run("migrate", "down", "--set", "app"), "rolled back app "+lastApp)
	require.Contains(t, run("migrate", "down", "--set", "outflow"), "rolled back outflow "+lastFramework)
	st := run(append([]string{"migrate", "status"}, app...)...)
	require.Regexp(t, `app\s+`+strings.ReplaceAll(lastApp, " ", `\s+`)+`\s+pending`, st)
	require.Regexp(t, `outflow\s+`+strings.ReplaceAll(lastFramework, " ", `\s+`)+`\s+pending`, st)
	// Without --set app, up and status leave the app's set alone, and say
	// it is installed.
	cmd := command(env, "migrate", "up")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s", stderr.String())
	require.Contains(t, string(out), "applied outflow "+lastFramework)
	require.NotContains(t, string(out), "applied app")
	require.Contains(t, stderr.String(), "add --set app")
	require.NotContains(t, run("migrate", "status"), "app ")
	up = run(append([]string{"migrate", "up"}, app...)...)
	require.Contains(t, up, "applied app "+lastApp)
}

// SIGTERM lets an in-flight request finish, then the process exits 0.
func TestServeDrainsOnSIGTERM(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	addr := freeAddr(t)
	cmd := command(map[string]string{"DATABASE_URL": s.URL, "HTTP_ADDR": addr}, "serve")
	var stderr outflowtest.LogBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	base := "http://" + addr
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		require.True(t, time.Now().Before(deadline), "serve did not become ready: %s", stderr.String())
		time.Sleep(20 * time.Millisecond) // polling a condition, with a deadline
	}

	// A request whose body arrives slowly is in flight when SIGTERM lands.
	body := &slowBody{
		first: []byte(`{"name":"Drain Shop",`), rest: []byte(`"webhook_url":"https://drain.example/h"}`),
		gate: make(chan struct{}), started: make(chan struct{}),
	}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, base+"/v1/merchants", body)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+createKey(t, s.URL, "--admin"))
	req.ContentLength = int64(len(body.first) + len(body.rest))
	// The body is sent only once the handler reads it (100 Continue): when
	// body.started fires, the request is in flight on the server.
	req.Header.Set("Expect", "100-continue")
	type result struct {
		status int
		err    error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		resp.Body.Close()
		done <- result{status: resp.StatusCode}
	}()
	<-body.started
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	waitForLog(t, &stderr, "shutting down")
	close(body.gate)

	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, http.StatusCreated, res.status, "the in-flight request completes")
	require.NoError(t, cmd.Wait(), "exit code 0 after SIGTERM: %s", stderr.String())
}

// slowBody sends its first part, then waits for gate before the rest.
type slowBody struct {
	first, rest []byte
	gate        chan struct{}
	started     chan struct{}
	state       int
}

func (b *slowBody) Read(p []byte) (int, error) {
	switch b.state {
	case 0:
		b.state = 1
		n := copy(p, b.first)
		return n, nil
	case 1:
		close(b.started)
		<-b.gate
		b.state = 2
		n := copy(p, b.rest)
		return n, nil
	default:
		return 0, io.EOF
	}
}

func waitForLog(t *testing.T, buf *outflowtest.LogBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(buf.String(), want) {
		require.True(t, time.Now().Before(deadline), "log never said %q", want)
		time.Sleep(10 * time.Millisecond)
	}
}

func TestForwardFailsFastOnUnreachableRedis(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	addr := freeAddr(t) // nothing listens there
	start := time.Now()
	out, err := command(map[string]string{"DATABASE_URL": s.URL, "REDIS_URL": "redis://:hunter2@" + addr + "/0"}, "forward", "--metrics-addr", "").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "connect to Redis at redis://:xxxxx@"+addr) // internal/redact
	require.NotContains(t, string(out), "hunter2")
	require.Less(t, time.Since(start), 15*time.Second, "never a hang")
}

func TestOutboxCommandFlags(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	env := map[string]string{"DATABASE_URL": s.URL}
	for args, want := range map[string]string{
		"outbox retry":              "invalid --id",
		"outbox retry --id 5 --all": "give --id or --all, not both",
		"outbox retry --id 99":      "row 99 is not parked",
		"outbox parked --limit 0":   "invalid --limit",
		"forward --batch-size 0":    "invalid --batch-size",
		"worker --claim-idle 0s":    "invalid --claim-idle",
		"dlq retry":                 "invalid --id",
		"dlq discard --id 42":       "not found or not dead",
		"outbox repartition":        "invalid --partitions",
		"outbox repartition --partitions 4 --takeover-after 0s": "invalid --takeover-after",
		"forward --stream-partitions 0":                         "invalid --stream-partitions",
	} {
		out, err := command(env, strings.Fields(args)...).CombinedOutput()
		require.Error(t, err, args)
		require.Contains(t, string(out), want, args)
	}
	out, err := command(env, "stats", "--json").Output()
	require.NoError(t, err, "%s", out)
	var stats map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(out, &stats), "%s", out)
	require.JSONEq(t, `{"pending":0,"parked":0,"oldest_pending_age_seconds":0,"published_total":0}`, string(stats["outbox"]))
	out, err = command(env, "outbox", "parked").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "no parked rows")
}

// kill -9 of a forwarder at any point loses nothing: another instance takes
// its partitions over once the leases expire and forwards every row.
func TestKilledForwarderLosesNothing(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	rdb := testservers.Redis(t)
	prefix := testservers.UniqueName(t, rdb)
	ctx := context.Background()

	// 5,000 rows on one topic, 100 aggregates, versions 1..50.
	_, err := s.Pool.Exec(ctx, `
		INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, occurred_at)
		SELECT gen_random_uuid(), $1, 'test', 'agg-' || a, v, 'test.happened', jsonb_build_object('v', v), now()
		FROM generate_series(1, 50) v, generate_series(1, 100) a ORDER BY v, a`, prefix)
	require.NoError(t, err)

	env := map[string]string{"DATABASE_URL": s.URL, "REDIS_URL": testservers.RedisURL()}
	args := []string{"forward", "--metrics-addr", "", "--batch-size", "50", "--takeover-after", "2s"}
	first := command(env, args...)
	require.NoError(t, first.Start())
	// Kill it in the middle of the work.
	// (On the stream: the outbox tells what was published only at the
	// forwarder's lease ticks.)
	outflowtest.WaitFor(t, 20*time.Second, "the first forwarder under way", func() bool {
		n, err := rdb.XLen(ctx, prefix).Result()
		require.NoError(t, err)
		return n > 0
	})
	require.NoError(t, first.Process.Signal(syscall.SIGKILL))
	_ = first.Wait()

	killedAt := time.Now()
	second := command(env, args...)
	require.NoError(t, second.Start())
	t.Cleanup(func() { _ = second.Process.Signal(syscall.SIGTERM); _ = second.Wait() })
	outflowtest.WaitFor(t, 30*time.Second, "every row forwarded", func() bool {
		var n int
		require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_state WHERE NOT published`).Scan(&n))
		return n == 0
	})
	t.Logf("took over and drained %s after the kill", time.Since(killedAt).Round(time.Millisecond))

	entries, err := rdb.XRange(ctx, prefix, "-", "+").Result()
	require.NoError(t, err)
	seen := map[string]bool{}
	last := map[string]int{}
	for _, m := range entries {
		msg, err := redisstream.DefaultMarshallerUnmarshaller{}.Unmarshal(m.Values)
		require.NoError(t, err)
		if seen[msg.UUID] {
			continue
		}
		seen[msg.UUID] = true
		agg := msg.Metadata.Get("aggregate_id")
		v, _ := strconv.Atoi(msg.Metadata.Get("aggregate_version"))
		require.Equal(t, last[agg]+1, v, "aggregate %s out of order", agg)
		last[agg] = v
	}
	require.Len(t, seen, 5000, "every row on the stream, duplicates aside")
}
