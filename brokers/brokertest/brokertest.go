package brokertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

// Group is the consumer group [Target.Subscribe] reads as. A broker that
// keeps messages only for the groups declared before they were published
// (RabbitMQ) must list it for every topic, or declare it when Subscribe is
// called: the suite subscribes before it publishes.
const Group = "brokertest"

// Target is one broker under test.
type Target struct {
	// Broker is what the forwarder publishes through. Required.
	Broker forwarder.Broker
	// Subscribe returns what Broker publishes to topic (an Outgoing.Topic),
	// as consumer group [Group] reads it; the suite acks each message as it
	// reads it. It is called before anything is published to topic.
	// Required.
	Subscribe func(t *testing.T, topic string) <-chan *message.Message
	// Refuse, when not nil, makes Broker refuse on its own, as the message's
	// fault (not [forwarder.ErrBrokerUnavailable]), every message published
	// to topic whose payload is over bytes, until allow is called, while it
	// takes the others. It is called before Subscribe and before anything
	// is published to topic. Nil for a broker that cannot refuse one message and
	// take the next (Redis, RabbitMQ, sql): the subtest that needs it then
	// checks nothing.
	Refuse func(t *testing.T, topic string, bytes int) (allow func())
}

// Harness opens the broker under test.
type Harness struct {
	// Open returns a target on names (topics, streams, tables, queues) no
	// other test uses. It is called once per subtest. Required.
	Open func(t *testing.T) Target
	// Outage returns a target whose broker sw cuts off: a server of the
	// test's own, or a proxy in front of a shared one
	// ([testservers.StartProxy], [testservers.StartRedis],
	// [testservers.StartNATS], [testservers.StartKafka]). Required: every
	// broker must report its outages as [forwarder.ErrBrokerUnavailable].
	Outage func(t *testing.T) (target Target, sw testservers.Outage)
}

// Run runs the forwarder's broker contract on h's broker. It needs the
// test PostgreSQL ([outflowtest.NewSchema]): the order and limit subtests
// run the real forwarder over a real outbox.
//
//   - PerMessageResults: Publish returns one result per message, nil once
//     the broker took it, and every message it took arrives.
//   - Unavailable: with the broker cut off, every message's error wraps
//     [forwarder.ErrBrokerUnavailable], within the context's deadline; once
//     the broker is back, Publish succeeds again without a new Broker.
//   - AggregateOrder: what the forwarder publishes reaches a consumer in
//     each aggregate's version order.
//   - PayloadLimit: a [forwarder.PayloadLimiter] counts a message at least
//     its payload, and a row over its limit is parked at its first attempt
//     while its aggregate's next row waits and the others flow; a broker
//     with no limit, or one far above the forwarder's default
//     MaxPayloadBytes, takes a message as large as that default, intact.
//   - RefusedMessageHoldsItsAggregate (with Target.Refuse): a message the
//     broker refuses fails alone, as the row's fault; the forwarder holds
//     its aggregate's later rows back and forwards the others; once the
//     broker takes it, the aggregate arrives in order.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Open == nil || h.Outage == nil {
		t.Fatal("brokertest: Harness.Open and Harness.Outage are required")
	}
	t.Run("PerMessageResults", func(t *testing.T) { perMessageResults(t, h.Open(t)) })
	t.Run("Unavailable", func(t *testing.T) { unavailable(t, h) })
	t.Run("AggregateOrder", func(t *testing.T) { aggregateOrder(t, h.Open(t)) })
	t.Run("PayloadLimit", func(t *testing.T) { payloadLimit(t, h.Open(t)) })
	t.Run("RefusedMessageHoldsItsAggregate", func(t *testing.T) { refusal(t, h.Open(t)) })
}

// BackendTarget is the target of an opened backend: its Broker, and its
// Subscriber for [Group] on every broker topic of a topic. Nil Refuse.
func BackendTarget(t *testing.T, b brokers.Backend) Target {
	return Target{
		Broker: b.Broker(),
		Subscribe: func(t *testing.T, topic string) <-chan *message.Message {
			t.Helper()
			msgs, _ := subscribeBackend(t, b, topic) // closed at the test's end
			return msgs
		},
	}
}

func perMessageResults(t *testing.T, target Target) {
	ctx := context.Background()
	if errs := target.Broker.Publish(ctx, nil); len(errs) != 0 {
		t.Fatalf("Publish(nil) returned %d results", len(errs))
	}
	topic := uniqueTopic()
	msgs := target.Subscribe(t, topic)
	var batch []forwarder.Outgoing
	want := map[string]bool{}
	for i := range 20 {
		o := outgoing(topic, fmt.Sprint("agg-", i), int64(1), 0)
		batch = append(batch, o)
		want[o.Message.UUID] = true
	}
	errs := publishWithin(t, target.Broker, batch, 30*time.Second)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	for _, m := range receive(t, msgs, len(want), 30*time.Second) {
		if !want[m.UUID] {
			t.Fatalf("received %s, which was not published", m.UUID)
		}
	}
}

func unavailable(t *testing.T, h Harness) {
	target, sw := h.Outage(t)
	topic := uniqueTopic()
	msgs := target.Subscribe(t, topic)
	for i, err := range publishWithin(t, target.Broker, []forwarder.Outgoing{outgoing(topic, "a", 1, 0)}, 30*time.Second) {
		if err != nil {
			t.Fatalf("before the outage, message %d: %v", i, err)
		}
	}
	receive(t, msgs, 1, 30*time.Second)

	sw.Stop()
	// A client may learn of the cut only at its next write: the first
	// publish may go out before the connection is known dead, but none may
	// succeed, and each must fail as the broker's fault, within its context.
	batch := []forwarder.Outgoing{outgoing(topic, "b", 1, 0), outgoing(topic, "c", 1, 0)}
	outflowtest.WaitFor(t, 30*time.Second, "a publish to fail as the broker's fault", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		errs := target.Broker.Publish(ctx, batch)
		if d := time.Since(start); d > 15*time.Second {
			t.Fatalf("Publish to a broker that is down took %s: it must honour the context", d)
		}
		if len(errs) != len(batch) {
			t.Fatalf("Publish returned %d results for %d messages", len(errs), len(batch))
		}
		failed := false
		for i, err := range errs {
			if err != nil && !errorsIsUnavailable(err) {
				t.Fatalf("with the broker down, message %d: got %v, want an error wrapping forwarder.ErrBrokerUnavailable", i, err)
			}
			failed = failed || err != nil
		}
		return failed
	})

	sw.Start()
	var last []error
	outflowtest.WaitFor(t, 60*time.Second, "Publish succeeding once the broker is back", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		last = target.Broker.Publish(ctx, batch)
		for _, err := range last {
			if err != nil {
				return false
			}
		}
		return len(last) == len(batch)
	})
	// b and c may arrive more than once (a publish the outage cut may have
	// been taken): at-least-once, deduplicated by the consumer.
	seen := map[string]bool{}
	deadline := time.After(30 * time.Second)
	for !seen[batch[0].Message.UUID] || !seen[batch[1].Message.UUID] {
		select {
		case m := <-msgs:
			m.Ack()
			seen[m.UUID] = true
		case <-deadline:
			t.Fatalf("after the outage, the messages published did not arrive (got %v)", seen)
		}
	}
}

func aggregateOrder(t *testing.T, target Target) {
	topic := uniqueTopic()
	msgs := target.Subscribe(t, topic)
	e := newEnv(t, topic)
	const aggregates, versions = 5, 20
	for v := range versions {
		for a := range aggregates {
			e.write(fmt.Sprint("agg-", a), int64(v+1), 0)
		}
	}
	e.run(target.Broker)
	outflowtest.WaitFor(t, 60*time.Second, "every row forwarded", func() bool { return e.count("published_at IS NULL") == 0 })
	requireOrder(t, entriesOf(t, receiveDistinct(t, msgs, aggregates*versions, 60*time.Second)), aggregates*versions)
}

func payloadLimit(t *testing.T, target Target) {
	topic := uniqueTopic()
	msgs := target.Subscribe(t, topic)
	e := newEnv(t, topic)
	lim, ok := target.Broker.(forwarder.PayloadLimiter)
	if ok && lim.MaxMessageBytes() > 0 {
		probe := outgoing(topic, "x", 1, 1000)
		if n := lim.MessageBytes(probe); n < len(probe.Message.Payload) {
			t.Fatalf("MessageBytes = %d for a payload of %d bytes: it must count at least the payload", n, len(probe.Message.Payload))
		}
	}
	if !ok || lim.MaxMessageBytes() <= 0 || lim.MaxMessageBytes() > 2*defaultMaxPayload {
		// No limit of the broker's own, or one far above the forwarder's
		// default (Redis's 512 MB, RabbitMQ's 16 or 128 MiB), which then
		// applies first: what the forwarder lets through by default must
		// arrive whole.
		big := e.write("x", 1, defaultMaxPayload-64)
		e.run(target.Broker)
		outflowtest.WaitFor(t, 60*time.Second, "the large row forwarded", func() bool { return e.count("published_at IS NULL") == 0 })
		got := receiveDistinct(t, msgs, 1, 60*time.Second)
		if got[0].UUID != big {
			t.Fatalf("received %s, want %s", got[0].UUID, big)
		}
		if n := len(got[0].Payload); n < defaultMaxPayload-64 {
			t.Fatalf("payload of %d bytes arrived, want at least %d", n, defaultMaxPayload-64)
		}
		return
	}
	limit := lim.MaxMessageBytes()
	x1 := e.write("x", 1, limit-64) // the payload fits MaxPayloadBytes, the message with its metadata does not
	e.write("x", 2, 0)
	y1 := e.write("y", 1, 0)
	e.run(target.Broker, func(c *forwarder.Config) { c.MaxPayloadBytes = limit; c.MaxAttempts = 3 })
	outflowtest.WaitFor(t, 30*time.Second, "x v1 parked, y forwarded", func() bool {
		return e.count("parked_at IS NOT NULL") == 1 && e.count("aggregate_id = 'y' AND published_at IS NOT NULL") == 1
	})
	parked, err := forwarder.ListParked(context.Background(), e.schema.Pool, 10)
	if err != nil {
		t.Fatal(err)
	}
	if parked[0].MessageID != x1 || parked[0].Attempts != 1 {
		t.Fatalf("parked %s after %d attempts, want %s after 1 (too large: parked before sending)", parked[0].MessageID, parked[0].Attempts, x1)
	}
	if want := fmt.Sprintf("over the broker's limit of %d bytes", limit); !strings.Contains(parked[0].LastError, want) {
		t.Fatalf("parked with %q, want it to say %q", parked[0].LastError, want)
	}
	if n := e.count("aggregate_id = 'x' AND aggregate_version = 2 AND published_at IS NULL"); n != 1 {
		t.Fatal("x v2 must wait behind its parked v1")
	}
	if got := receiveDistinct(t, msgs, 1, 30*time.Second); got[0].UUID != y1 {
		t.Fatalf("received %s, want only y (%s): x v1 must never be sent", got[0].UUID, y1)
	}
}

func refusal(t *testing.T, target Target) {
	if target.Refuse == nil {
		t.Log("the broker cannot refuse one message and take the next: nothing to check")
		return
	}
	topic := uniqueTopic()
	allow := target.Refuse(t, topic, 3000)
	msgs := target.Subscribe(t, topic)

	// One Publish: the refused message fails alone, as its own fault.
	direct := []forwarder.Outgoing{outgoing(topic, "d", 1, 5000), outgoing(topic, "e", 1, 0)}
	errs := publishWithin(t, target.Broker, direct, 30*time.Second)
	if errs[0] == nil || errorsIsUnavailable(errs[0]) {
		t.Fatalf("a refused message: got %v, want the message's own error", errs[0])
	}
	if errs[1] != nil {
		t.Fatalf("the message after a refused one: %v", errs[1])
	}

	e := newEnv(t, topic)
	x1 := e.write("x", 1, 5000)
	e.write("x", 2, 0)
	e.write("x", 3, 0)
	for a := range 5 {
		for v := range 2 {
			e.write(fmt.Sprint("other-", a), int64(v+1), 0)
		}
	}
	e.run(target.Broker)
	outflowtest.WaitFor(t, 30*time.Second, "x v1 refused and retried", func() bool {
		return e.count("message_id = $1 AND attempts >= 3", x1) == 1
	})
	outflowtest.WaitFor(t, 30*time.Second, "the other aggregates forwarded", func() bool {
		return e.count("aggregate_id <> 'x' AND published_at IS NOT NULL") == 10
	})
	if n := e.count("aggregate_id = 'x' AND published_at IS NULL"); n != 3 {
		t.Fatalf("%d x rows marked published while v1 is refused", 3-n)
	}
	allow()
	outflowtest.WaitFor(t, 60*time.Second, "x forwarded", func() bool { return e.count("published_at IS NULL") == 0 })
	got := receiveDistinct(t, msgs, 1+13, 60*time.Second) // e, then the outbox's 13
	var fromOutbox []*message.Message
	for _, m := range got {
		if m.UUID != direct[1].Message.UUID {
			fromOutbox = append(fromOutbox, m)
		}
	}
	requireOrder(t, entriesOf(t, fromOutbox), 13)
}

type payload struct {
	N   int    `json:"n"`
	Pad string `json:"pad,omitempty"`
}

func (payload) EventType() string { return "brokertest.tested" }

func uniqueTopic() string { return "bt" + strings.ToLower(watermill.NewShortUUID()[:10]) }

// outgoing is a message as the forwarder builds one, with pad bytes of
// padding in its payload.
func outgoing(topic, aggregate string, version int64, pad int) forwarder.Outgoing {
	ev, err := events.New(context.Background(), events.Aggregate{Type: "test", ID: aggregate, Version: version},
		payload{N: int(version), Pad: strings.Repeat("p", pad)})
	if err != nil {
		panic(err)
	}
	msg, err := ev.Message(context.Background())
	if err != nil {
		panic(err)
	}
	return forwarder.Outgoing{Topic: topic, AggregateID: aggregate, Message: msg}
}

func publishWithin(t *testing.T, b forwarder.Broker, msgs []forwarder.Outgoing, d time.Duration) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	errs := b.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("Publish returned %d results for %d messages", len(errs), len(msgs))
	}
	return errs
}

// receive takes n messages, acking each.
func receive(t *testing.T, ch <-chan *message.Message, n int, within time.Duration) []*message.Message {
	t.Helper()
	var out []*message.Message
	deadline := time.After(within)
	for len(out) < n {
		select {
		case m := <-ch:
			m.Ack()
			out = append(out, m)
		case <-deadline:
			t.Fatalf("received %d of %d messages within %s", len(out), n, within)
		}
	}
	return out
}

// receiveDistinct takes messages until n distinct ones arrived (a broker
// may deliver one more than once), in the order of their first delivery.
func receiveDistinct(t *testing.T, ch <-chan *message.Message, n int, within time.Duration) []*message.Message {
	t.Helper()
	seen := map[string]bool{}
	var out []*message.Message
	deadline := time.After(within)
	for len(out) < n {
		select {
		case m := <-ch:
			m.Ack()
			if !seen[m.UUID] {
				seen[m.UUID] = true
				out = append(out, m)
			}
		case <-deadline:
			t.Fatalf("received %d of %d distinct messages within %s", len(out), n, within)
		}
	}
	return out
}

type entry struct {
	aggregate string
	version   int64
	messageID string
}

func entriesOf(t *testing.T, msgs []*message.Message) []entry {
	t.Helper()
	out := make([]entry, len(msgs))
	for i, m := range msgs {
		env, err := events.EnvelopeFromMessage(m)
		if err != nil {
			t.Fatalf("message %s: %v", m.UUID, err)
		}
		out[i] = entry{env.AggregateID, env.AggregateVersion, env.MessageID}
	}
	return out
}

// requireOrder checks that each aggregate's messages came in version order
// and that want distinct messages arrived.
func requireOrder(t *testing.T, entries []entry, want int) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int64{}
	for _, en := range entries {
		if seen[en.messageID] {
			continue
		}
		seen[en.messageID] = true
		if en.version != last[en.aggregate]+1 {
			t.Fatalf("aggregate %s: version %d after %d", en.aggregate, en.version, last[en.aggregate])
		}
		last[en.aggregate] = en.version
	}
	if len(seen) != want {
		t.Fatalf("%d distinct messages, want %d", len(seen), want)
	}
}

// env is an outbox in a schema of its own, and a forwarder over it.
type env struct {
	t      *testing.T
	schema *outflowtest.Schema
	writer *outbox.Writer
}

func newEnv(t *testing.T, topic string) *env {
	t.Helper()
	// No limit at write time: the rows play events written before the
	// writer had one, which the forwarder must still park (PayloadLimit).
	w, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": topic}, MaxEventBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, schema: outflowtest.NewSchema(t), writer: w}
}

func (e *env) write(aggregate string, version int64, pad int) string {
	e.t.Helper()
	ctx := context.Background()
	ev, err := events.New(ctx, events.Aggregate{Type: "test", ID: aggregate, Version: version},
		payload{N: int(version), Pad: strings.Repeat("p", pad)})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, e.schema.Pool, func(tx pgx.Tx) error { return e.writer.PublishTx(ctx, tx, ev) }); err != nil {
		e.t.Fatal(err)
	}
	return ev.MessageID
}

func (e *env) run(b forwarder.Broker, mut ...func(*forwarder.Config)) {
	e.t.Helper()
	cfg := forwarder.Config{
		Pool: e.schema.Pool, Broker: b, Logger: slog.New(slog.NewTextHandler(e.t.Output(), &slog.HandlerOptions{Level: slog.LevelError})),
		PollInterval: 50 * time.Millisecond, RetryBackoff: 10 * time.Millisecond, RetryBackoffMax: 50 * time.Millisecond,
		OutageBackoffMax: 100 * time.Millisecond, MaxAttempts: 1000,
	}
	for _, m := range mut {
		m(&cfg)
	}
	f, err := forwarder.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("forwarder: %v", err)
		}
	})
}

// count counts the outbox rows where holds, the forwarder's state under
// the outbox's former column names (outflowtest.OutboxAsSeen): a row reads
// published from the forwarder's lease tick after it published it.
func (e *env) count(where string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.schema.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+outflowtest.OutboxAsSeen+" WHERE "+where, args...).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// defaultMaxPayload is forwarder.Config.MaxPayloadBytes's default.
const defaultMaxPayload = 1 << 20

func errorsIsUnavailable(err error) bool { return errors.Is(err, forwarder.ErrBrokerUnavailable) }
