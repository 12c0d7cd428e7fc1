package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/outflow-dev/outflow/forwarder"
)

// stageClock records, per message id, the moments between a producer's
// transaction and the worker that the outbox and the worker do not: the
// producer's commit returning, and the forwarder's publish call starting
// and returning (the broker's acknowledgement). With ackTimes they split
// commit-to-handled into five parts, so that a tail says where it grew.
type stageClock struct {
	mu        sync.Mutex
	committed map[string]time.Time
	published map[string]publishCall
}

// publishCall is when the publish call carrying a message started, and
// when it returned.
type publishCall struct{ start, acked time.Time }

func newStageClock() *stageClock {
	return &stageClock{committed: map[string]time.Time{}, published: map[string]publishCall{}}
}

// commit records that the transaction writing message id has committed.
func (c *stageClock) commit(id string) {
	now := time.Now()
	c.mu.Lock()
	c.committed[id] = now
	c.mu.Unlock()
}

// publish records a publish call of msgs, from start to now; a message
// published again keeps its first.
func (c *stageClock) publish(msgs []forwarder.Outgoing, start time.Time) {
	call := publishCall{start, time.Now()}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range msgs {
		if _, ok := c.published[m.Message.UUID]; !ok {
			c.published[m.Message.UUID] = call
		}
	}
}

// stageP99s are the p99s, in milliseconds, of the five parts of
// commit-to-handled: the producer's transaction (from created_at, where
// the latency starts, to its commit returning), on to the forwarder's
// publish call, the publish itself, on to the worker's outermost
// middleware, and the worker's own part up to the acknowledgement. Each
// part's p99 is of its own: they do not add up to the whole's.
// fromCommit is the p99 of the whole but the first part, from the
// producer's commit returning: the "commit to handled" taken at
// its word, where the whole takes the transaction's start (created_at, on
// the database's clock) and so counts the producer's own round trips and
// flush. It is low by the time the commit's answer took to come back.
// All six are of the events never held as a gap, so fromCommit compares
// with the run's "p99 of the others".
type stageP99s struct {
	commit, toPublish, publish, toWorker, inWorker float64
	fromCommit                                     float64
}

func (s stageP99s) String() string {
	return fmt.Sprintf("%.1f / %.1f / %.1f / %.1f / %.1f", s.commit, s.toPublish, s.publish, s.toWorker, s.inWorker)
}

// stages returns the stageP99s of rows, the rows never held (neverHeld's:
// a held one's handling is its dead letter's resolution, not an
// acknowledgement), of those timed at every step.
func (c *stageClock) stages(a *ackTimes, rows []sentRow) stageP99s {
	var parts [6][]float64
	ms := func(from, to time.Time) float64 { return float64(to.Sub(from)) / float64(time.Millisecond) }
	c.mu.Lock()
	defer c.mu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range rows {
		committed, ok1 := c.committed[r.id]
		pub, ok2 := c.published[r.id]
		got, ok3 := a.received[r.id]
		done, ok4 := a.at[r.id]
		if ok1 && ok2 && ok3 && ok4 {
			for i, d := range []float64{ms(r.at, committed), ms(committed, pub.start), ms(pub.start, pub.acked), ms(pub.acked, got), ms(got, done), ms(committed, done)} {
				parts[i] = append(parts[i], d)
			}
		}
	}
	var p [6]float64
	for i, d := range parts {
		if len(d) > 0 {
			slices.Sort(d)
			p[i] = quantile(d, 0.99)
		}
	}
	return stageP99s{p[0], p[1], p[2], p[3], p[4], p[5]}
}

// timed wraps inner so that every publish is recorded in c. It keeps the
// optional interfaces inner has (an Auditor publishes through
// PublishReceipts, a PayloadLimiter bounds the claim), as
// brokers.WithCloudEvents does: a wrapper that hid them would measure a
// forwarder other than the one that runs.
func timed(inner forwarder.Broker, c *stageClock) forwarder.Broker {
	t := timedBroker{inner: inner, clock: c}
	_, limits := inner.(forwarder.PayloadLimiter)
	if _, audits := inner.(forwarder.Auditor); audits {
		if limits {
			return timedAuditLimiter{timedAuditor{t}}
		}
		return timedAuditor{t}
	}
	if limits {
		return timedLimiter{t}
	}
	return t
}

type timedBroker struct {
	inner forwarder.Broker
	clock *stageClock
}

func (t timedBroker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	start := time.Now()
	errs := t.inner.Publish(ctx, msgs)
	t.clock.publish(msgs, start)
	return errs
}

type timedLimiter struct{ timedBroker }

func (t timedLimiter) MaxMessageBytes() int {
	return t.inner.(forwarder.PayloadLimiter).MaxMessageBytes()
}

func (t timedLimiter) MessageBytes(m forwarder.Outgoing) int {
	return t.inner.(forwarder.PayloadLimiter).MessageBytes(m)
}

type timedAuditor struct{ timedBroker }

func (t timedAuditor) PublishReceipts(ctx context.Context, msgs []forwarder.Outgoing) ([]forwarder.Receipt, []error) {
	start := time.Now()
	receipts, errs := t.inner.(forwarder.Auditor).PublishReceipts(ctx, msgs)
	t.clock.publish(msgs, start)
	return receipts, errs
}

func (t timedAuditor) Check(ctx context.Context, brokerTopic string, prev []byte, held []forwarder.Held, partial bool) (forwarder.Verdict, error) {
	return t.inner.(forwarder.Auditor).Check(ctx, brokerTopic, prev, held, partial)
}

type timedAuditLimiter struct{ timedAuditor }

func (t timedAuditLimiter) MaxMessageBytes() int {
	return timedLimiter{t.timedBroker}.MaxMessageBytes()
}

func (t timedAuditLimiter) MessageBytes(m forwarder.Outgoing) int {
	return timedLimiter{t.timedBroker}.MessageBytes(m)
}
