// Package consumer runs a service's event handlers: a [Worker] subscribes
// each [Handler] to its topic with a consumer group of its own and wraps it
// in the idempotency middleware, so a handler is a plain function that gets
// the decoded event and the transaction to write its effects in.
//
//	w.Add(consumer.On("fulfil-orders", "orders",
//		func(ctx context.Context, tx pgx.Tx, ev events.Event, o OrderPlaced) error { ... }))
//
// [On] takes the function of one payload type, [OnEach] one per type
// (each made with [Typed]); a [Handler] literal lists its EventTypes and
// gets ev.Payload to assert. The worker needs a Broker (brokers.Open, with
// the forwarder's configuration): it links no broker client of its own.
//
// A handler's mistakes fail before any message: Add refuses an event type
// the Registry does not know ([ErrUnknownEventType]) or a typed function
// whose payload is not the registered Go type ([ErrPayloadType]), and
// [CheckRoutes], given the writer's routes too, reports every handler on a
// topic its events are not routed to ([ErrNotRouted]).
//
// Per message, from the outside in:
//
//  1. with Run, Watermill's Recoverer, turning a panic into an error;
//  2. the caller's middleware: the router's own (with AddTo), then
//     WorkerConfig.Middleware, then the Handler's Middleware, each in the
//     order given;
//  3. the idempotency middleware: it opens the transaction, records the
//     message and checks its version;
//  4. the handler (events of types it does not list still advance the
//     aggregate's version, unseen by it; a panic is its error);
//
// then, on the way out, the queued statements and the commit (inside 3),
// and the acknowledgement once every middleware has returned. A failure
// stores the message in dead_letters for retries (see package idempotency),
// so the stream keeps flowing.
//
// The caller's middleware run outside the transaction, never inside it, and
// that is the contract: a metrics or tracing middleware measures the whole
// handling, commit included, and sees the transaction's outcome when the
// handler returns; a throttle delays a message before it takes a connection
// and its aggregate's lock, not while holding them; a value a middleware
// puts in the message's context reaches the handler's ctx. A deadline
// (Watermill's Timeout middleware) bounds the handler's own work, the
// statements it runs with ctx, but not the bookkeeping nor the commit, which
// run detached from it: a handler that fails at its deadline rolls back and
// is retried; one that returns nil past it is committed, once. With
// MaxBatch > 1, messages handled together share a transaction, and a
// handler failing at its deadline rolls back its batch, whose messages then
// run one by one.
//
// Settings are per handler: a Handler's BatchSize, ClaimIdle and
// Idempotency fields (retries, gaps, MaxBatch...) override the worker's,
// field by field, and default to them.
//
// Run builds a Watermill router of its own (WorkerConfig.Router, Plugins,
// Middleware); AddTo puts the handlers on a router of the caller's instead.
//
// A handler's Committed callback runs after its message's transaction
// committed: the place to wake in-process work that reads what it wrote.
//
// Each handler also reads its replay topic, consumer.ReplayTopic(Name)
// ("outflow.replay.<name>"), with the same subscriber, consumer group and
// middleware chain as its topic: that is where `outflow replay` (package
// replay) re-delivers retained outbox rows to this handler alone. A
// replayed message is deduplicated and ordered by version like any other,
// so it applies only what the handler has not handled (or was made to
// forget by a consumer reset). A replay is keyed on [ReplayKey], so on a
// partitioned backend it lands on one partition: the cost is one more
// subscription per handler, on Redis one more blocking XREADGROUP loop
// (watermill router handler "<name>@<broker topic>"). Handler.NoReplay
// turns it off. Groups lists the replay topic too, for RabbitMQ to declare
// its queue before the first replay.
//
// WorkerConfig.Registerer gets every handler's idempotency counters and two
// gauges, sampled every LagInterval from a broker that reports lag
// (brokers.LagReporter: every built-in backend; see each one's package for
// what it counts, amqp telling only ready messages and no age):
// outflow_consumer_lag_events and
// outflow_consumer_oldest_unhandled_age_seconds. They describe the consumer
// group, so every worker of it reports the same value: aggregate them with
// max(), not sum().
//
// This package is framework: it imports no application code. The reference
// payments service's handlers live in package handlers.
package consumer
