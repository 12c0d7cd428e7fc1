package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/outflow-dev/outflow/forwarder"
)

var _ forwarder.Auditor = natsBroker{}

// auditState is what one audit of a subject leaves for the next: the
// forwarder keeps it in PostgreSQL, opaque.
type auditState struct {
	// Created is the stream's creation time: a stream deleted and created
	// again (by an operator, by Outflow after a publish found it missing)
	// has another. Zero when the stream did not exist.
	Created time.Time `json:"c"`
	// Last is the stream's last sequence: it never goes back while the
	// stream keeps what it acknowledged, purges and limits included.
	Last uint64 `json:"l"`
	// SafeSince (Unix ns, the server's clock) is the stored time of the
	// subject's first message some consumer had not acknowledged, or of its
	// first message when no consumer exists: what a loss found next time
	// may have taken starts there, and what is older every consumer had
	// handled.
	SafeSince int64 `json:"s"`
}

// observed is one look at a subject's stream.
type observed struct {
	stream  bool // the stream exists
	created time.Time
	last    uint64
}

// decide is the audit's judgement: the reason of a loss, or "" when the
// stream still holds what prev had seen. Limits (MaxAge, MaxMsgs) and
// purges move the first sequence, never the last one nor the creation
// time, so they are never taken for a loss.
func decide(prev *auditState, o observed) string {
	switch {
	case prev == nil:
		return "" // a baseline
	case !o.stream && !prev.Created.IsZero():
		return fmt.Sprintf("stream missing, it had sequences up to %d", prev.Last)
	case !o.stream || prev.Created.IsZero():
		// The stream did not exist at the baseline: whatever it holds now
		// was stored since.
		return ""
	case !o.created.Equal(prev.Created):
		return fmt.Sprintf("stream recreated (created %s, was %s), it had sequences up to %d",
			o.created.UTC().Format(time.RFC3339Nano), prev.Created.UTC().Format(time.RFC3339Nano), prev.Last)
	case o.last < prev.Last:
		return fmt.Sprintf("last sequence went back from %d to %d", prev.Last, o.last)
	}
	return ""
}

// floorInput is what safeSince needs of a subject: its consumers' ack
// floors and the stream's state.
type floorInput struct {
	// consumers says whether any consumer reads the subject; floor is then
	// the lowest stream sequence one of them has not acknowledged (ack
	// floor + 1).
	consumers bool
	floor     uint64
	firstSeq  uint64
	lastTime  time.Time // the stream's last message's time; zero when empty
}

// safeFrom is the stream sequence from which the subject's messages are
// still needed by some consumer: the lowest ack floor + 1 over its
// consumers, or the stream's first sequence when no consumer reads it
// (nothing has handled any of it).
func safeFrom(in floorInput) uint64 {
	if !in.consumers {
		return max(in.firstSeq, 1)
	}
	return max(in.floor, in.firstSeq, 1)
}

// safeSince turns the time of the subject's message at or after
// safeFrom (zero when there is none) into the state's SafeSince: when every
// message was acknowledged, a message stored later has a time at or after
// the stream's last message's, or after now when the stream is empty.
func safeSince(next time.Time, in floorInput, now time.Time) time.Time {
	switch {
	case !next.IsZero():
		return next
	case !in.lastTime.IsZero():
		return in.lastTime
	}
	return now
}

// auditTimeout bounds one subject's audit.
const auditTimeout = 10 * time.Second

// Topics lists the subjects of topic: [forwarder.Auditor].
func (nb natsBroker) Topics(topic string) []string { return nb.b.Topics(topic) }

// BrokerTopic is the subject of topic's aggregateID: [forwarder.Auditor].
func (nb natsBroker) BrokerTopic(topic, aggregateID string) string {
	return nb.b.subject(topic, aggregateID)
}

// Audit compares subject's stream with prev (see [forwarder.Auditor]): a
// stream info, a consumer list of the stream and one message get (the
// time of the subject's first message not acknowledged): three API
// requests, which read no message but one.
func (nb natsBroker) Audit(ctx context.Context, subject string, prev []byte) ([]byte, *forwarder.Loss, error) {
	b := nb.b
	// A request nobody answers (a stream leader being elected) would wait
	// as long as ctx, which may be forever.
	ctx, cancel := context.WithTimeout(ctx, auditTimeout)
	defer cancel()
	var st *auditState
	if len(prev) > 0 {
		st = new(auditState)
		if err := json.Unmarshal(prev, st); err != nil {
			st = nil // unreadable: a new baseline, as for a lost state
		}
	}
	fail := func(err error) ([]byte, *forwarder.Loss, error) {
		return nil, nil, fmt.Errorf("nats audit %s: %w", subject, err)
	}
	stream := streamName(b.streamTopic(subject))
	now := time.Now()
	var (
		o    observed
		next = auditState{SafeSince: now.UnixNano()}
	)
	info, err := b.js.StreamInfo(stream, nats.Context(ctx))
	switch {
	case errors.Is(err, nats.ErrStreamNotFound):
	case err != nil:
		return fail(err)
	default:
		o = observed{stream: true, created: info.Created, last: info.State.LastSeq}
		in := floorInput{firstSeq: info.State.FirstSeq}
		if info.State.LastSeq > 0 {
			in.lastTime = info.State.LastTime
		}
		consumers, err := b.consumers(ctx, stream)
		if err != nil {
			return fail(err)
		}
		for _, c := range consumers {
			if !readsSubject(c.Config, subject) {
				continue
			}
			if floor := c.AckFloor.Stream + 1; !in.consumers || floor < in.floor {
				in.floor = floor
			}
			in.consumers = true
		}
		t, err := b.nextTime(ctx, stream, subject, safeFrom(in))
		if err != nil {
			return fail(err)
		}
		next = auditState{Created: info.Created, Last: info.State.LastSeq, SafeSince: safeSince(t, in, now).UnixNano()}
	}
	reason := decide(st, o)
	raw, err := json.Marshal(next)
	if err != nil {
		return fail(err)
	}
	if reason == "" {
		return raw, nil, nil
	}
	return raw, &forwarder.Loss{Since: time.Unix(0, st.SafeSince), Reason: reason}, nil
}

// readsSubject reports whether a consumer of cfg may deliver subject's
// messages: no filter, the subject, or a wildcard filter matching it.
func readsSubject(cfg nats.ConsumerConfig, subject string) bool {
	filters := cfg.FilterSubjects
	if cfg.FilterSubject != "" {
		filters = append(filters, cfg.FilterSubject)
	}
	if len(filters) == 0 {
		return true
	}
	for _, f := range filters {
		if subjectMatches(f, subject) {
			return true
		}
	}
	return false
}

// subjectMatches reports whether filter (with * and > wildcards) matches
// subject.
func subjectMatches(filter, subject string) bool {
	ft, st := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, f := range ft {
		switch {
		case f == ">":
			return len(st) > i
		case i >= len(st):
			return false
		case f != "*" && f != st[i]:
			return false
		}
	}
	return len(ft) == len(st)
}

// consumers lists stream's consumers with their ack floors. nats.go's
// lister drops errors (its channel just ends), and an audit that missed a
// consumer would take a later SafeSince than the truth: this pages the
// JetStream API's consumer list itself and fails on any error.
func (b *natsBackend) consumers(ctx context.Context, stream string) ([]*nats.ConsumerInfo, error) {
	var all []*nats.ConsumerInfo
	for {
		req, err := json.Marshal(struct {
			Offset int `json:"offset"`
		}{len(all)})
		if err != nil {
			return nil, err
		}
		msg, err := b.conn.RequestWithContext(ctx, "$JS.API.CONSUMER.LIST."+stream, req)
		if err != nil {
			return nil, fmt.Errorf("list consumers: %w", err)
		}
		var resp struct {
			Total     int                  `json:"total"`
			Consumers []*nats.ConsumerInfo `json:"consumers"`
			Error     *nats.APIError       `json:"error"`
		}
		if err := json.Unmarshal(msg.Data, &resp); err != nil {
			return nil, fmt.Errorf("list consumers: %w", err)
		}
		if resp.Error != nil {
			return nil, fmt.Errorf("list consumers: %w", resp.Error)
		}
		all = append(all, resp.Consumers...)
		if len(resp.Consumers) == 0 || len(all) >= resp.Total {
			return all, nil
		}
	}
}
