package outflowtest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/brokers"
	_ "github.com/outflow-dev/outflow/brokers/sql" // the pipeline's broker: PostgreSQL, no external server
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/idempotency"
)

// ErrCrashInjected is the error of a handler's crash injected by
// [Pipeline.CrashInHandler].
var ErrCrashInjected = errors.New("outflowtest: crash injected")

// DefaultWaitTimeout is how long [Pipeline.WaitHandled] waits by default:
// it bounds how long a failing test takes to say so, and a loaded CI
// machine starting a pipeline's forwarder, worker and broker groups took
// more than 20 s (ExampleStartPipeline, at load 20).
const DefaultWaitTimeout = time.Minute

// Pipeline is a forwarder and a worker running in the test's process, by
// default over the PostgreSQL broker backend (brokers kind sql: message
// tables in the same schema), so no external broker is needed, or over the
// broker the service deploys ([WithBackend]): events a test commits to the
// outbox reach its handlers through the real forwarder, broker,
// subscriber and idempotency middleware. Start it with [StartPipeline]; it
// stops when the test ends.
//
// Crash injection ([Pipeline.CrashBeforePublish],
// [Pipeline.CrashAfterPublish], [Pipeline.CrashInHandler],
// [Pipeline.StopForwarder]) lets a test prove its handlers keep their
// guarantees where a real process can die.
type Pipeline struct {
	t        testing.TB
	pool     *pgxpool.Pool
	handlers []consumer.Handler
	timeout  time.Duration
	logger   *slog.Logger
	backend  brokers.Backend
	fwdCfg   forwarder.Config
	unseen   []string // event types no handler needs to take (AllowUnhandled)

	mu           sync.Mutex
	fwd          *forwarder.Forwarder
	stopFwd      context.CancelFunc // stops the forwarder's supervisor
	fwdDone      chan struct{}
	crashFwd     context.CancelFunc // ends the running forwarder instance
	restarts     int
	beforePub    int            // publishes to fail before the broker
	afterPub     int            // publishes to fail after the broker took them
	handlerCrash map[string]int // handler name: crashes left
	published    map[string]int // message id: times the broker took it
}

// PipelineOption configures a [Pipeline].
type PipelineOption func(*pipelineConfig)

type pipelineConfig struct {
	timeout   time.Duration
	idem      idempotency.Config
	logger    *slog.Logger
	routes    outbox.Routes
	routesSet bool
	unseen    []string
	backend   brokers.Backend
}

// WithBackend runs the pipeline over backend (opened by the test, with
// brokers.Open or a backend package's constructor, and closed by it after
// the pipeline stops) instead of the PostgreSQL broker: the broker the
// service deploys, with the same crash points. Only the backends the test
// imports are linked into it.
func WithBackend(backend brokers.Backend) PipelineOption {
	return func(c *pipelineConfig) { c.backend = backend }
}

// WithRoutes gives the pipeline the routes the service's writer uses
// (outbox.Config.Routes): StartPipeline then fails the test on every
// handler whose topic those routes send none of its events to, naming it
// (see consumer.CheckRoutes).
func WithRoutes(routes outbox.Routes) PipelineOption {
	return func(c *pipelineConfig) { c.routes, c.routesSet = routes, true }
}

// AllowUnhandled names event types the test writes that no handler of the
// pipeline takes, on purpose (their aggregate's version still advances):
// without it, WaitHandled fails on them, as on a handler's mistake.
func AllowUnhandled(eventTypes ...string) PipelineOption {
	return func(c *pipelineConfig) { c.unseen = append(c.unseen, eventTypes...) }
}

// WithWaitTimeout sets how long WaitHandled waits (DefaultWaitTimeout).
func WithWaitTimeout(d time.Duration) PipelineOption {
	return func(c *pipelineConfig) { c.timeout = d }
}

// WithPipelineIdempotency sets the worker's idempotency configuration;
// unset retry and gap delays are short, as a test wants them.
func WithPipelineIdempotency(cfg idempotency.Config) PipelineOption {
	return func(c *pipelineConfig) { c.idem = cfg }
}

// WithPipelineLogger sets the components' logger (by default warnings and errors
// go to the test's output).
func WithPipelineLogger(l *slog.Logger) PipelineOption {
	return func(c *pipelineConfig) { c.logger = l }
}

// StartPipeline starts a forwarder and a worker running handlers on the
// schema pool points at (migrated, see [NewSchema]). Events are routed as
// the writer routed them: a handler reads the topic its Topic names. It
// stops, waiting for both, when t ends.
func StartPipeline(t testing.TB, pool *pgxpool.Pool, reg *events.Registry, handlers []consumer.Handler, opts ...PipelineOption) *Pipeline {
	t.Helper()
	pc := pipelineConfig{timeout: DefaultWaitTimeout}
	for _, o := range opts {
		o(&pc)
	}
	if pc.logger == nil {
		pc.logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	dbURL, err := poolURL(pool)
	if err != nil {
		t.Fatalf("outflowtest: %v", err)
	}
	p := &Pipeline{t: t, pool: pool, timeout: pc.timeout, logger: pc.logger, unseen: pc.unseen,
		handlerCrash: map[string]int{}, published: map[string]int{}}
	if pc.routesSet {
		if err := consumer.CheckRoutes(pc.routes, reg, handlers...); err != nil {
			t.Fatalf("outflowtest: %v", err)
		}
	}

	ctx := context.Background()
	backend := pc.backend
	if backend == nil {
		backend, err = brokers.Open(ctx, brokers.Config{Kind: brokers.SQL, Logger: pc.logger, SQL: brokers.SQLConfig{
			DatabaseURL: dbURL, PollInterval: 20 * time.Millisecond, MaxConns: int32(len(handlers) + 4), Retention: -1,
		}})
		if err != nil {
			t.Fatalf("outflowtest: open the sql broker: %v", err)
		}
		t.Cleanup(func() { _ = backend.Close() })
	}
	p.backend = backend

	p.fwdCfg = forwarder.Config{
		Pool: pool, Broker: crashBroker{p: p, inner: backend.Broker()}, Logger: pc.logger,
		Partitions: 1, PollInterval: 50 * time.Millisecond, MinPollInterval: time.Millisecond,
		TakeoverAfter: time.Second, RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond,
		OutageBackoffMax: 50 * time.Millisecond, Retention: -1, ShutdownTimeout: 5 * time.Second,
	}

	idem := pc.idem
	idem.RetryBackoff = cmp.Or(idem.RetryBackoff, 10*time.Millisecond)
	idem.RetryBackoffMax = cmp.Or(idem.RetryBackoffMax, 100*time.Millisecond)
	idem.RetryPollInterval = cmp.Or(idem.RetryPollInterval, 10*time.Millisecond)
	idem.GapRetryDelay = cmp.Or(idem.GapRetryDelay, 50*time.Millisecond)
	w, err := consumer.NewWorker(consumer.WorkerConfig{Pool: pool, Broker: backend, Registry: reg,
		ClaimIdle: 5 * time.Second, Idempotency: idem, Logger: pc.logger})
	if err != nil {
		t.Fatalf("outflowtest: %v", err)
	}
	for _, h := range handlers {
		h.Func = p.crashing(h.Name, h.Func)
		if err := w.Add(h); err != nil {
			t.Fatalf("outflowtest: %v", err)
		}
		p.handlers = append(p.handlers, h)
	}

	wctx, stopWorker := context.WithCancel(ctx)
	workerDone := make(chan error, 1)
	go func() { workerDone <- w.Run(wctx) }()
	t.Cleanup(func() {
		p.StopForwarder()
		stopWorker()
		if err := <-workerDone; err != nil {
			t.Errorf("outflowtest: worker: %v", err)
		}
	})
	p.StartForwarder()
	return p
}

// poolURL is the connection string of pool, which the sql backend needs
// to open its own connections to the same schema.
func poolURL(pool *pgxpool.Pool) (string, error) {
	cfg := pool.Config()
	s := cfg.ConnString()
	if s == "" {
		return "", errors.New("the pool was not built from a connection string; the pipeline needs one (pgxpool.New)")
	}
	sp, ok := cfg.ConnConfig.RuntimeParams["search_path"]
	if !ok || strings.Contains(s, "search_path") || !strings.Contains(s, "://") {
		return s, nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("pool connection string: %w", err)
	}
	q := u.Query()
	q.Set("search_path", sp)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// StartForwarder starts the forwarder again after StopForwarder (the
// pipeline starts with it running).
func (p *Pipeline) StartForwarder() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopFwd != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	p.stopFwd, p.fwdDone = cancel, done
	go p.superviseForwarder(ctx, done)
}

// StopForwarder stops the forwarder and waits until it has: rows
// committed now stay in the outbox, the state of a service whose
// forwarder is down (or crashed after the commit, before publishing).
// StartForwarder brings it back.
func (p *Pipeline) StopForwarder() {
	p.mu.Lock()
	stop, done := p.stopFwd, p.fwdDone
	p.stopFwd, p.fwdDone = nil, nil
	p.mu.Unlock()
	if stop == nil {
		return
	}
	stop()
	<-done
}

// superviseForwarder runs forwarder instances until ctx is done: one that
// "crashed" (see crashBroker) is replaced by a new instance, with a new
// id and none of the old one's memory, as a process supervisor would.
func (p *Pipeline) superviseForwarder(ctx context.Context, done chan struct{}) {
	defer close(done)
	for ctx.Err() == nil {
		cfg := p.fwdCfg
		cfg.InstanceID = "outflowtest-" + uuid.NewString()[:8]
		f, err := forwarder.New(cfg)
		if err != nil {
			p.t.Errorf("outflowtest: forwarder: %v", err)
			return
		}
		ictx, crash := context.WithCancel(ctx)
		p.mu.Lock()
		p.fwd, p.crashFwd = f, crash
		p.mu.Unlock()
		err = f.Run(ictx)
		crash()
		if err != nil && ctx.Err() == nil {
			p.t.Errorf("outflowtest: forwarder: %v", err)
			return
		}
		p.mu.Lock()
		p.fwd = nil
		if ctx.Err() == nil {
			p.restarts++
		}
		p.mu.Unlock()
	}
}

// ForwarderRestarts is how many times an injected crash replaced the
// forwarder.
func (p *Pipeline) ForwarderRestarts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restarts
}

// CrashBeforePublish makes the forwarder die, n times, after it claimed a
// batch and before the broker got it: the claim is undone and a new
// forwarder instance publishes the rows. Nothing is lost.
func (p *Pipeline) CrashBeforePublish(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.beforePub += n
}

// CrashAfterPublish makes the forwarder die, n times, after the broker
// acknowledged a batch and before the rows were marked published: a new
// instance publishes them again, so the handlers receive each message
// twice, with the same message id, and must apply it once.
func (p *Pipeline) CrashAfterPublish(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.afterPub += n
}

// CrashInHandler makes handler name crash n times just after its Func
// returned without error, before the commit: its transaction rolls back
// and the message comes back (retried by the consumer), so Func runs
// again. Effects written in the transaction happen once; effects written
// anywhere else happen again.
func (p *Pipeline) CrashInHandler(name string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.handlerCrash[name] += n
}

// Published is how many times the broker took the message: 2 after a
// crash after publish.
func (p *Pipeline) Published(messageID string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.published[messageID]
}

// PendingCrashes is how many injected crashes have not fired yet.
func (p *Pipeline) PendingCrashes() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.beforePub + p.afterPub
	for _, c := range p.handlerCrash {
		n += c
	}
	return n
}

func (p *Pipeline) crashing(name string, fn consumer.Func) consumer.Func {
	return func(ctx context.Context, tx pgx.Tx, ev events.Event) error {
		if err := fn(ctx, tx, ev); err != nil {
			return err
		}
		p.mu.Lock()
		crash := p.handlerCrash[name] > 0
		if crash {
			p.handlerCrash[name]--
		}
		p.mu.Unlock()
		if crash {
			// An error, not a panic: the consumer treats both alike (the
			// transaction rolls back, the message is retried), and a panic
			// would log its goroutine's stack at every injected crash.
			return fmt.Errorf("%w in handler %q after its Func returned (message %s)", ErrCrashInjected, name, ev.MessageID)
		}
		return nil
	}
}

// errCrashed is what a crashed forwarder's batch gets: an outage, so the
// rows stay pending with no attempt counted, as after a real crash, whose
// claim transaction rolls back.
var errCrashed = fmt.Errorf("%w: outflowtest: forwarder crash injected", forwarder.ErrBrokerUnavailable)

// crashBroker is the real broker with the forwarder's crash points.
type crashBroker struct {
	p     *Pipeline
	inner forwarder.Broker
}

func (b crashBroker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	p := b.p
	p.mu.Lock()
	before := p.beforePub > 0
	if before {
		p.beforePub--
	}
	p.mu.Unlock()
	if before {
		p.crashForwarder()
		return fill(len(msgs), errCrashed)
	}
	errs := b.inner.Publish(ctx, msgs)
	p.mu.Lock()
	for i, m := range msgs {
		if i < len(errs) && errs[i] == nil {
			p.published[m.Message.UUID]++
		}
	}
	after := p.afterPub > 0
	if after {
		p.afterPub--
	}
	p.mu.Unlock()
	if after {
		p.crashForwarder()
		return fill(len(msgs), errCrashed)
	}
	return errs
}

func fill(n int, err error) []error {
	out := make([]error, n)
	for i := range out {
		out[i] = err
	}
	return out
}

// crashForwarder ends the running forwarder instance; its batch in flight
// finishes with the crash's errors (nothing marked) and the supervisor
// starts a new one.
func (p *Pipeline) crashForwarder() {
	p.mu.Lock()
	crash := p.crashFwd
	p.mu.Unlock()
	if crash != nil {
		crash()
	}
}

// WaitHandled waits until everything committed to the outbox so far has
// been forwarded and settled by every handler reading its topic: applied,
// skipped as a duplicate or stale, or not listed by the handler, with no
// retry or held message left. It fails t at once when a row or message
// is dead (parked by the forwarder, or dead in dead_letters), naming it,
// and after the wait timeout otherwise, saying what is left.
//
// It also fails t, naming the topic and the event type, when rows are in
// the outbox that no handler takes: on a topic no handler reads, or of a
// type no handler of their topic lists (see [AllowUnhandled]). Such rows
// settle at once, or never reach a handler, so waiting for them would
// prove nothing: a handler's wrong Topic or EventTypes would pass.
func (p *Pipeline) WaitHandled() {
	p.t.Helper()
	ctx := context.Background()
	p.requireTaken(ctx)
	deadline := time.Now().Add(p.timeout)
	names := make([]string, len(p.handlers))
	topics := make([]string, len(p.handlers))
	for i, h := range p.handlers {
		names[i], topics[i] = h.Name, h.Topic
	}
	for {
		st, err := p.state(ctx, names, topics)
		if err != nil {
			p.t.Fatalf("outflowtest: WaitHandled: %v", err)
		}
		if st.dead != "" {
			p.t.Fatalf("outflowtest: WaitHandled: %s", st.dead)
		}
		if st.unpublished == 0 && st.unhandled == 0 {
			unread, err := p.unread(ctx)
			if err != nil {
				p.t.Fatalf("outflowtest: WaitHandled: %v", err)
			}
			if unread == "" {
				p.requireTaken(ctx) // rows the handlers wrote meanwhile
				return
			}
			st.sample = unread
		}
		p.mu.Lock()
		fwd, running := p.fwd, p.stopFwd != nil
		p.mu.Unlock()
		if st.unpublished > 0 && !running {
			p.t.Fatalf("outflowtest: WaitHandled: %d outbox rows wait and the forwarder is stopped (StartForwarder)", st.unpublished)
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("outflowtest: WaitHandled: timed out after %s: %d outbox rows not published, %d deliveries not settled: %s",
				p.timeout, st.unpublished, st.unhandled, st.sample)
		}
		if fwd != nil {
			fwd.Wake()
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type pipelineState struct {
	unpublished, unhandled int
	sample, dead           string
}

// state reads what is left to do. A (row, handler) pair is settled when
// the handler's consumer has its aggregate at the row's version or past it
// (applied, or skipped: the consumer's only bookkeeping is that version)
// and no open retry or hold of the message.
func (p *Pipeline) state(ctx context.Context, names, topics []string) (pipelineState, error) {
	var st pipelineState
	err := p.pool.QueryRow(ctx, `
		WITH h(name, topic) AS (SELECT * FROM unnest($1::text[], $2::text[])),
		todo AS (
			SELECT o.message_id, o.event_type, o.aggregate_id, o.aggregate_version, h.name
			FROM outbox o JOIN h ON h.topic = o.topic
			WHERE NOT EXISTS (SELECT 1 FROM consumer_aggregate_versions v WHERE v.consumer = h.name
			                  AND v.aggregate_type = o.aggregate_type AND v.aggregate_id = o.aggregate_id
			                  AND v.version >= o.aggregate_version)
			   OR EXISTS (SELECT 1 FROM dead_letters d WHERE d.message_id = o.message_id AND d.consumer = h.name
			              AND d.status IN ('held', 'retrying'))
		)
		SELECT (SELECT count(*) FROM outbox_state WHERE NOT published AND parked_at IS NULL),
		       (SELECT count(*) FROM todo),
		       coalesce((SELECT string_agg(format('%s %s v%s for %s', event_type, aggregate_id, aggregate_version, name), '; ')
		                 FROM (SELECT * FROM todo LIMIT 5) s), ''),
		       coalesce((SELECT string_agg(x, '; ') FROM (
		           SELECT format('outbox row %s (%s %s v%s) parked by the forwarder: %s', o.message_id, o.event_type, o.aggregate_id, o.aggregate_version, f.last_error) AS x
		           FROM outbox_failures f JOIN outbox o USING (id) WHERE f.parked_at IS NOT NULL
		           UNION ALL
		           SELECT format('message %s (%s %s v%s) dead for handler %s: %s %s', message_id, event_type, aggregate_id, aggregate_version, consumer, reason, error)
		           FROM dead_letters WHERE status = 'dead' AND consumer = ANY($1)) s), '')`,
		names, topics).Scan(&st.unpublished, &st.unhandled, &st.sample, &st.dead)
	if err != nil {
		return st, fmt.Errorf("read the pipeline's state: %w", err)
	}
	return st, nil
}

// unread names a handler whose consumer group has not yet read everything
// its topic's broker table holds (a duplicate published after a crash
// included), or "" when every group is at the end.
func (p *Pipeline) unread(ctx context.Context) (string, error) {
	for _, h := range p.handlers {
		for _, topic := range p.backend.Topics(h.Topic) {
			msgs := pgx.Identifier{"watermill_" + topic}.Sanitize()
			offs := pgx.Identifier{"watermill_offsets_" + topic}.Sanitize()
			var exists bool
			if err := p.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL`,
				msgs, offs).Scan(&exists); err != nil {
				return "", fmt.Errorf("read broker tables: %w", err)
			}
			if !exists {
				continue
			}
			var n int
			err := p.pool.QueryRow(ctx, `SELECT count(*) FROM `+msgs+` m WHERE NOT EXISTS (
				SELECT 1 FROM `+offs+` g WHERE g.consumer_group = $1
				   AND (g.last_processed_transaction_id, coalesce(g.offset_acked, 0)) >= (m.transaction_id, m."offset"))`,
				h.Name).Scan(&n)
			if err != nil {
				return "", fmt.Errorf("read broker offsets: %w", err)
			}
			if n > 0 {
				return fmt.Sprintf("handler %s has %d broker messages of %s to read", h.Name, n, topic), nil
			}
		}
	}
	return "", nil
}

// requireTaken fails t when the outbox holds rows no handler of the
// pipeline takes: on a topic none reads, or of a type none of their
// topic's handlers lists (and not allowed by AllowUnhandled).
func (p *Pipeline) requireTaken(ctx context.Context) {
	p.t.Helper()
	rows, err := p.pool.Query(ctx, `SELECT topic, event_type, count(*) FROM outbox GROUP BY 1, 2 ORDER BY 1, 2`)
	if err != nil {
		p.t.Fatalf("outflowtest: WaitHandled: read the outbox: %v", err)
	}
	type kind struct {
		Topic, EventType string
		N                int
	}
	kinds, err := pgx.CollectRows(rows, pgx.RowToStructByPos[kind])
	if err != nil {
		p.t.Fatalf("outflowtest: WaitHandled: read the outbox: %v", err)
	}
	var problems []string
	for _, k := range kinds {
		if slices.Contains(p.unseen, k.EventType) {
			continue
		}
		var readers, lists []string
		for _, h := range p.handlers {
			if h.Topic != k.Topic {
				continue
			}
			readers = append(readers, h.Name)
			if h.Wants(k.EventType) {
				lists = append(lists, h.Name)
			}
		}
		switch {
		case len(readers) == 0:
			problems = append(problems, fmt.Sprintf("%d outbox rows of %s on topic %q, which no handler reads (the handlers read: %s)",
				k.N, k.EventType, k.Topic, strings.Join(p.topics(), ", ")))
		case len(lists) == 0:
			problems = append(problems, fmt.Sprintf("%d outbox rows of %s on topic %q, a type no handler of the topic lists (%s; AllowUnhandled(%q) if they are meant to pass unseen)",
				k.N, k.EventType, k.Topic, strings.Join(readers, ", "), k.EventType))
		}
	}
	if len(problems) > 0 {
		p.t.Fatalf("outflowtest: WaitHandled: no handler takes %s", strings.Join(problems, "; "))
	}
}

// topics lists the handlers' topics, sorted, once each.
func (p *Pipeline) topics() []string {
	var out []string
	for _, h := range p.handlers {
		out = append(out, h.Topic)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
