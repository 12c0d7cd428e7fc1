// Package outflowtest helps tests, ours and our users', run against real
// PostgreSQL in isolation, and is the test kit for a service's own events
// and handlers, in the spirit of River's rivertest.
//
//	func TestPayCommandWritesItsEvent(t *testing.T) {
//		s := outflowtest.NewSchema(t, mymigrations.Set()) // a schema of the test's own, migrated
//		svc := billing.NewService(s.Pool, writer)
//		inv, err := svc.Pay(t.Context(), "inv_1")
//		...
//		outflowtest.RequireEvent(t.Context(), t, s.Pool, outflowtest.Want{Type: "invoice.paid", AggregateID: inv.ID, Version: 2})
//	}
//
// A handler, synchronously and without a broker ([NewHandlerHarness]), or
// the whole pipeline with crashes injected ([StartPipeline]): see below
// and the examples.
//
// # Schemas
//
// [NewSchema] creates a fresh schema in the test database, applies the
// framework's migrations and then the service's own sets given to it
// (NewSchema(t, mymigrations.Set())), and returns a pool whose search_path
// points at it, so tests run in parallel and re-run clean. The test database URL comes from
// OUTFLOW_TEST_DATABASE_URL and defaults to
// postgres://postgres@127.0.0.1:5432/outflow_test?sslmode=disable; the
// database is created if it does not exist. A database that cannot be
// reached fails the test with a message saying how to start one: tests never
// skip silently. A table a test needs beyond the framework's and its sets'
// it creates on the returned pool. (The servers Outflow's own tests start,
// brokers and proxies, are in the framework's internal/testservers.)
//
// # What a transaction wrote
//
// [RequireEvent], [RequireEvents] and [RequireNoEvent] check the outbox as
// a [Querier] sees it: pass the transaction under test to check what it
// wrote before it commits (nothing is visible elsewhere until then), or a
// pool for what committed. A [Want] matches on event type, aggregate,
// version, topic and payload; the payload is compared as JSON, a map
// naming just the fields it cares about. A failure lists every event the
// outbox holds and why each one does not match. [ReadOutbox] returns them
// all; [Written.Event] decodes one with the service's registry, and
// [Written.Message] is the message the forwarder sends for it (built by
// forwarder.Message), a discarded row's discard marker included.
//
// # A handler, synchronously
//
// [NewHandlerHarness] runs one consumer.Handler through the real
// idempotency middleware (the one a consumer.Worker wraps it in), with no
// broker: [HandlerHarness.Deliver] records the message, checks its
// aggregate version, runs the handler in the transaction and commits, and
// returns the [Outcome]: Applied, Duplicate, Stale, Held (a version that
// arrived before its predecessor; it applies, and shows in
// [Delivery.Released], when the predecessor does), Failed (rolled back and
// dead-lettered for a retry, see [HandlerHarness.Retry]) or Nacked.
// [HandlerHarness.Redeliver] delivers the same message id again.
// [HandlerHarness.DeliverCrashing] crashes the handler after its Func
// returned, before the commit; [HandlerHarness.RequireIdempotent] uses it to
// prove a handler writes nothing outside its transaction (a crashed
// delivery leaves no trace, the retry applies once, a duplicate changes
// nothing): the bug the middleware cannot fix for a handler.
//
// # Forwarder and worker, in-process
//
// [StartPipeline] runs the real forwarder and a consumer.Worker in the
// test's process, by default over the PostgreSQL broker backend (the sql
// kind: broker tables in the same schema), so events the test commits
// reach the handlers with no external broker; [WithBackend] runs it over
// the broker the service deploys instead, crash points included. The kit
// links no other broker's client: a test that wants one imports its
// backend. [Pipeline.WaitHandled] waits until
// everything committed so far has been forwarded and settled by every
// handler of its topic (and fails at once, naming it, on a row or message
// that went dead). The pipeline stops when the test ends.
//
// A handler's mistakes fail the test instead of passing it: a listed event
// type the registry does not know fails StartPipeline (as Worker.Add, and
// [NewHandlerHarness]); given the writer's routes ([WithRoutes]), so does a
// handler on a topic they send none of its events to; and WaitHandled fails,
// naming the topic and the type, on outbox rows no handler takes (a topic
// no handler reads, a type none of its topic's handlers lists: allow those
// written on purpose with [AllowUnhandled]).
//
// # Crashes where they matter
//
//   - After the commit, before the publish: [Pipeline.StopForwarder] (rows
//     committed meanwhile wait in the outbox; [Pipeline.StartForwarder]
//     forwards them) and [Pipeline.CrashBeforePublish] (the forwarder dies
//     holding a claimed batch; a new instance publishes it).
//   - After the publish, before the mark: [Pipeline.CrashAfterPublish] (the
//     broker has the batch, the forwarder dies before marking it; a new
//     instance publishes it again, the handlers get each message twice and
//     must apply it once; [Pipeline.Published] counts the copies).
//   - Inside a handler, after its writes: [Pipeline.CrashInHandler] (the
//     transaction rolls back and the message is retried: effects in the
//     transaction happen once, effects elsewhere twice).
//
// The crashes are real mechanisms, not mocks: a wrapper around the real
// broker that ends the forwarder instance (a supervisor starts a new one,
// with none of its memory) and a wrapper around the handler's Func that
// fails it with [ErrCrashInjected] after it returned (the consumer takes a
// panic and an error alike; an error logs one line, not a stack). The forwarder's crashes report the batch as a
// broker outage, so the rows stay pending with no attempt counted, as after
// a real crash, whose claim transaction rolls back.
//
// # Event schemas
//
// [RequireCompatibleEvents] checks a service's registry against the
// snapshot of its event schemas committed beside the test (package
// events/schemacheck): a change that breaks readers of stored events (a
// changed type, a new required field, a rename, an upcaster that does not
// read an older version) fails the test naming the type, the version, the
// field and the rule. OUTFLOW_UPDATE_EVENT_SCHEMAS=1 records the snapshot
// instead, the developer's explicit acceptance of what it lists.
//
// The kit is framework: it imports no application code. Its tests and
// examples define their own event types. Components log at Warn and above
// to the test's output; [WithPipelineLogger] changes that.
package outflowtest
