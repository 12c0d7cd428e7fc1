package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/apikey"
	"github.com/outflow-dev/outflow/app/httpapi"
	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks/sender"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// chromiumPath finds the browser the end-to-end test drives: $OUTFLOW_CHROMIUM,
// else Debian's chromium on PATH. Missing, the test fails saying how to get it
// (the project's rule: a test never skips for want of a tool).
func chromiumPath(t testing.TB) string {
	t.Helper()
	names := []string{"chromium", "chromium-browser", "google-chrome"}
	if p := os.Getenv("OUTFLOW_CHROMIUM"); p != "" {
		names = []string{p}
	}
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatalf("chromium not found on PATH (nor $OUTFLOW_CHROMIUM): the console's browser test drives it headless; " +
		"install it with `scripts/services.sh tools` (Debian: apt-get install chromium)")
	return ""
}

// browser is the one headless Chromium the browser tests share: started
// by the first of them, ended by TestMain. Each test has a tab of its own
// in a browser context of its own (cookies, storage and cache apart), so
// they can run in parallel; starting a Chromium for each cost the package
// a few CPU-seconds apiece.
var browser struct {
	once   sync.Once
	ctx    context.Context // the browser's first tab, kept open; nil if it failed to start
	cancel func()
	err    error
}

// stopBrowser ends the shared Chromium, if a test started it.
func stopBrowser() {
	if browser.cancel != nil {
		browser.cancel()
	}
}

// TestMain ends the shared Chromium once every test has run.
func TestMain(m *testing.M) {
	code := m.Run()
	stopBrowser()
	os.Exit(code)
}

// newBrowser returns a tab of the shared headless Chromium, in a browser
// context of the test's own, closed when the test ends. The sandbox is off
// only as root, where Chromium refuses to start with it.
func newBrowser(t testing.TB) context.Context {
	t.Helper()
	path := chromiumPath(t)
	browser.once.Do(func() {
		opts := append(chromedp.DefaultExecAllocatorOptions[:],
			chromedp.ExecPath(path),
			chromedp.WindowSize(1280, 900),
			chromedp.Flag("disable-gpu", true),
		)
		if os.Geteuid() == 0 {
			opts = append(opts, chromedp.NoSandbox)
		}
		actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
		ctx, cancelTab := chromedp.NewContext(actx)
		browser.cancel = func() { cancelTab(); cancelAlloc() }
		// The first action starts the browser.
		if browser.err = chromedp.Do(ctx, chromedp.Navigate("about:blank")); browser.err == nil {
			browser.ctx = ctx
		}
	})
	if browser.ctx == nil {
		t.Fatalf("start chromium (%s): %v", path, browser.err)
	}
	ctx, cancel := chromedp.NewContext(browser.ctx, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	// The tab's first action opens it: fail here, clearly, if it cannot.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("open a chromium tab: %v", err)
	}
	return ctx
}

// scripted waits until the page's scripts have run: console.js attaches
// its handlers (a filter's select submitting its form, a confirmation) at
// DOMContentLoaded, and an element is visible before that; on a loaded
// machine a choice made in between went unheard (TestAuditInBrowser failed
// once on it: the filter never applied).
func scripted(t testing.TB, ctx context.Context) {
	t.Helper()
	outflowtest.WaitFor(t, 30*time.Second, "the page's scripts to have run", func() bool {
		state, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.readyState`))
		require.NoError(t, err)
		return state == "complete"
	})
}

// clickInPage clicks the element sel in the page's own script, in one
// step: on the overview, whose live refresh replaces the markup every 2 s,
// a node chromedp found a moment before its click can be gone by then
// ("Could not find node with given id": TestHealthAtAGlanceInBrowser
// failed once on it, under load).
func clickInPage(t testing.TB, ctx context.Context, sel string) {
	t.Helper()
	found, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(
		`(() => { const el = document.querySelector(%q); if (!el) { return false; } el.click(); return true; })()`, sel)))
	require.NoError(t, err)
	require.True(t, found, "no %s to click", sel)
}

// run runs browser actions with a deadline, failing the test on error.
func run(t testing.TB, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("browser: %s: %v", what, err)
	}
}

// artifactsDir is where the test writes its screenshots: under
// $OUTFLOW_TEST_ARTIFACTS (what CI keeps; `make test` sets it to
// test-artifacts/), else a temporary directory, never the source tree.
func artifactsDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if base := os.Getenv("OUTFLOW_TEST_ARTIFACTS"); base != "" {
		dir = filepath.Join(base, strings.ReplaceAll(t.Name(), "/", "_"))
		require.NoError(t, os.MkdirAll(dir, 0o755))
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

// screenshot writes the whole page, beyond the viewport, as dir/name.png.
func screenshot(t testing.TB, ctx context.Context, dir, name string) string {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
	require.NoError(t, err, "screenshot %s", name)
	path := filepath.Join(dir, name+".png")
	require.NoError(t, os.WriteFile(path, png, 0o644))
	return path
}

// refusingBroker refuses, as a broker refusing a message would, every
// event of the aggregates in refuse: with the forwarder's MaxAttempts at 1
// such a row is parked at once. Clearing refuse lets a retried row through.
// A discard marker goes through: what it refuses is the event.
type refusingBroker struct {
	forwarder.Broker
	mu     sync.Mutex
	refuse map[string]bool
}

var errRefused = errors.New("refused by the test's broker")

func (b *refusingBroker) setRefused(aggregateID string, on bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refuse[aggregateID] = on
}

func (b *refusingBroker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	b.mu.Lock()
	refused := make([]bool, len(msgs))
	var any bool
	for i, m := range msgs {
		refused[i] = b.refuse[m.AggregateID] && !events.IsDiscardMarker(m.Message)
		any = any || refused[i]
	}
	b.mu.Unlock()
	if !any {
		return b.Broker.Publish(ctx, msgs)
	}
	errs := make([]error, len(msgs))
	var pass []forwarder.Outgoing
	var at []int
	for i, m := range msgs {
		if refused[i] {
			errs[i] = errRefused
			continue
		}
		pass = append(pass, m)
		at = append(at, i)
	}
	if len(pass) > 0 {
		for j, err := range b.Broker.Publish(ctx, pass) {
			errs[at[j]] = err
		}
	}
	return errs
}

// stack is an `outflow serve --roles api,forwarder,worker` in the test's
// process: the payments API (payments are made through it, with an admin
// key, as an operator's script would), a forwarder and a worker (the analytics
// projection, the merchant notifier, and a handler that fails every event
// of the payments in failFor, so they become dead letters) over Redis
// Streams, on a schema of its own.
type stack struct {
	schema   *outflowtest.Schema
	svc      *app.Service
	apiSrv   *httptest.Server
	broker   *refusingBroker
	backend  brokers.Backend
	adminKey string

	mu      sync.Mutex
	failFor map[string]bool
}

func startStack(t *testing.T) *stack {
	t.Helper()
	ctx := context.Background()
	s := &stack{schema: outflowtest.NewSchema(t, appmigrations.Sets()...), failFor: map[string]bool{}}
	pool := s.schema.Pool

	w, err := outbox.NewWriter(outbox.Config{Routes: app.Routes})
	require.NoError(t, err)
	s.svc, err = app.NewService(app.Config{Pool: pool, Events: w, AllowPrivateWebhooks: true})
	require.NoError(t, err)
	api, err := httpapi.New(httpapi.Config{Service: s.svc, Pool: pool, Logger: quiet})
	require.NoError(t, err)
	s.apiSrv = httptest.NewServer(api)
	t.Cleanup(s.apiSrv.Close)

	key, err := apikey.Create(ctx, pool, apikey.New{Name: "browser-test admin"})
	require.NoError(t, err)
	s.adminKey = key.Secret

	prefix := testservers.UniqueName(t, testservers.Redis(t)) + ":"
	backend, err := brokers.Open(ctx, brokers.Config{Kind: brokers.Redis, StreamPartitions: 2, Logger: quiet,
		Redis: brokers.RedisConfig{URL: testservers.RedisURL(), StreamPrefix: prefix}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = backend.Close() })
	s.backend = backend

	s.broker = &refusingBroker{Broker: backend.Broker(), refuse: map[string]bool{}}
	fwd, err := forwarder.New(forwarder.Config{Pool: pool, Broker: s.broker, MessagingSystem: string(brokers.Redis),
		Partitions: 2, PollInterval: 50 * time.Millisecond, MaxAttempts: 1, Logger: quiet})
	require.NoError(t, err)
	goRun(t, fwd.Run)

	reg := events.NewRegistry()
	require.NoError(t, paymentevents.Register(reg))
	wk, err := consumer.NewWorker(consumer.WorkerConfig{Pool: pool, Broker: backend, Registry: reg, Logger: quiet,
		Idempotency: idempotency.Config{MaxAttempts: 2, RetryBackoff: 10 * time.Millisecond,
			RetryBackoffMax: 50 * time.Millisecond, RetryPollInterval: 20 * time.Millisecond}})
	require.NoError(t, err)
	require.NoError(t, wk.Add(handlers.SyncAnalytics()))
	snd := sender.New(pool, sender.Config{Logger: quiet, AllowPrivate: true})
	require.NoError(t, wk.Add(handlers.NotifyMerchant(pool, handlers.NotifyConfig{Wake: snd.Wake})))
	require.NoError(t, wk.Add(s.failingHandler()))
	goRun(t, wk.Run)
	goRun(t, snd.Run)
	return s
}

// failingHandler is a consumer that fails every event of the payments in
// failFor: after its attempts they are dead letters of "ledger-export".
func (s *stack) failingHandler() consumer.Handler {
	return consumer.Handler{
		Name:  "ledger-export",
		Topic: app.PaymentsTopic,
		Func: func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.failFor[ev.AggregateID] {
				return errors.New("ledger export: account closed")
			}
			return nil
		},
	}
}

// merchant creates a merchant whose webhook endpoint answers 204.
func (s *stack) merchant(t *testing.T) app.CreatedMerchant {
	t.Helper()
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(site.Close)
	m, err := s.svc.CreateMerchant(context.Background(), app.NewMerchant{Name: "Shop", WebhookURL: site.URL + "/hooks"})
	require.NoError(t, err)
	return m
}

// api calls the payments API as an operator's script would, with the
// admin key, and decodes the payment it answers.
func (s *stack) api(t *testing.T, path, body string) app.Payment {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.apiSrv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+s.adminKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.Less(t, res.StatusCode, 300, "POST %s: %s", path, raw)
	var p app.Payment
	require.NoError(t, json.Unmarshal(raw, &p), "POST %s: %s", path, raw)
	return p
}

// create creates a payment through the API: one event.
func (s *stack) create(t *testing.T, merchantID string, amount int64) app.Payment {
	t.Helper()
	return s.api(t, "/v1/payments", fmt.Sprintf(`{"merchant_id":%q,"amount":%d,"currency":"EUR"}`, merchantID, amount))
}

// pay creates a payment and pays it through the API: two events of one
// aggregate.
func (s *stack) pay(t *testing.T, merchantID string, amount int64) app.Payment {
	t.Helper()
	p := s.create(t, merchantID, amount)
	return s.api(t, "/v1/payments/"+p.ID+"/pay", `{}`)
}

func goRun(t *testing.T, fn func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("stack component: %v", err)
		}
	})
}

// answerDialog answers the next JavaScript dialog (the console's confirm())
// with accept, and sends its message on the channel it returns. It first
// waits for the page's scripts, which attach the confirm() to its forms.
func answerDialog(t *testing.T, ctx context.Context, accept bool) <-chan string {
	t.Helper()
	scripted(t, ctx)
	dctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	dialogs := chromedp.Events(dctx, page.JavascriptDialogOpening)
	msg := make(chan string, 1)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			_, _ = chromedp.Call(dctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: accept})
			msg <- ev.Message
			return
		}
	}()
	return msg
}

// received is the next message of ch, a dialog's, waited for 30 s at most.
func received(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(30 * time.Second):
		t.Fatal("no dialog")
		return ""
	}
}

// loadedReadTimeout is the ReadTimeout of every test that is not about a
// stalled database (newEnv's; stalls restores the default): on a machine
// the whole suite loads, a journey's or a panel's reads can pass the
// default 700 ms, and the page would be a 503 instead of what the test
// looks at.
const loadedReadTimeout = 5 * time.Second
