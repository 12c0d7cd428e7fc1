package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/outflow-dev/outflow/forwarder"
)

var _ forwarder.Auditor = natsBroker{}

// auditState is what one Check of a subject leaves for the next: the
// forwarder keeps it in PostgreSQL, opaque.
type auditState struct {
	// Created is the stream's creation time as Check last saw it: a
	// stream deleted and created again (by an operator, by Outflow after a
	// publish found it missing, after its only store was lost) has
	// another. Zero when the stream was missing.
	Created time.Time `json:"c"`
	// Consumers are the marks of the consumers reading the subject, by
	// name, as Check last saw them.
	Consumers map[string]consumerMark `json:"k,omitempty"`
	// Awaited are consumers lost with the data, by when they were first
	// missed (Unix ms): see [forwarder.AwaitLostGroups].
	Awaited map[string]int64 `json:"w,omitempty"`
}

// consumerMark is what Check keeps of one consumer, to tell next time
// whether it read what went meanwhile.
type consumerMark struct {
	// Created tells a consumer from another of the same name (a durable
	// deleted and created again starts over).
	Created time.Time `json:"c"`
	// Delivered counts the consumer's deliveries (its delivered consumer
	// sequence). A purge, a limit or a deletion moves the consumer's ack
	// floor and its delivered stream sequence over what it removed,
	// whether the consumer read it or not; they never move this count.
	Delivered uint64 `json:"d"`
	// Stream is the consumer's delivered stream sequence: it had passed
	// every message up to there.
	Stream uint64 `json:"s"`
}

// reader is one consumer reading the subject, as a look saw it.
type reader struct {
	consumerMark
	// Floor is the consumer's ack floor (stream sequence): everything up
	// to it was acknowledged, or removed from the stream.
	Floor uint64
}

// look is what Check read of a subject's stream.
type look struct {
	// seqs are the held positions as stream sequences (0: unreadable).
	seqs []uint64
	// found[i]: seqs[i] holds held[i]'s message (the subject's, with its
	// id, or with no id to compare). other[i]: it holds another message.
	found, other []bool
	// before are the consumers reading the subject, read before the
	// messages were looked for; after, read after them (the same map when
	// nothing was missing, and no second read was needed).
	before, after map[string]reader
	stream        bool // the stream exists (read after the messages)
	created       time.Time
	last          uint64 // the stream's last sequence
}

// getParallel bounds the message gets of one Check in flight at once.
const getParallel = 64

// checkTimeout bounds a Check whose ctx has no deadline: a request nobody
// answers (a stream leader being elected) would wait as long as ctx.
const checkTimeout = 30 * time.Second

// Check judges each held message of subject ([forwarder.Auditor]): a held
// position is the stream sequence its PubAck gave.
//
// A message found at its sequence (on the subject, with its message id)
// is Settled when every consumer reading the subject had acknowledged it
// before the look (ack floor at or past it; the consumers are read before
// the messages, so what was acknowledged then was acknowledged while the
// message was there), Unsettled otherwise, and when no consumer reads the
// subject yet. A sequence holding another message (another id or another
// subject) is Lost: JetStream reuses the sequences a stream lost at its
// tail (a store restored from an older copy, a replica behind taking
// over), and a recreated stream starts again at 1.
//
// A message not found is Lost when the stream is missing, was created
// again since the last Check (Created differs), or its sequence is above
// the stream's last one (the stream went back). Otherwise it was removed
// (a limit, a purge, a deletion) from the stream the last Check saw, and
// it is Settled only when every consumer reading the subject shows it
// had it:
//   - its ack floor is at or past it now; and
//   - it is a consumer the last Check saw (same name, same Created, its
//     delivery count not gone back), at least one of them, that made
//     enough deliveries since the last Check to have read it (see vouch).
//
// The second condition is there because JetStream moves every consumer's
// ack floor over what a purge removes (and, once the consumer reads on,
// over what a limit removed), read or not: the floor alone cannot tell a
// purge of acknowledged messages from one of a backlog nobody read. The
// delivery count is what a removal does not move. A consumer created
// since the last Check (a new group starting on what the stream holds) is
// judged by its ack floor alone. With no earlier Check of the stream (no
// state), nothing vouches for a missing message: it is Lost.
//
// "Had it" is "was delivered it, and the floor passed it": a message
// delivered, then removed before its ack (a consumer that crashed while
// handling it), leaves no trace in JetStream, and counts as had.
//
// Cost: one CONSUMER.LIST (a page per 256 consumers of the stream), one
// STREAM.MSG.GET per held message (getParallel in flight; each reads the
// whole message: an audit reads each message about once, as one more
// consumer would, since a message leaves the held set once every consumer
// acknowledged it), one STREAM.INFO, and a second CONSUMER.LIST only when
// a held message was missing.
func (nb natsBroker) Check(ctx context.Context, subject string, prev []byte, held []forwarder.Held, _ bool) (forwarder.Verdict, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, checkTimeout)
		defer cancel()
	}
	var st *auditState
	if len(prev) > 0 {
		st = new(auditState)
		if json.Unmarshal(prev, st) != nil {
			st = nil // unreadable: as for a lost state
		}
	}
	l, err := nb.b.look(ctx, subject, held)
	if err != nil {
		return forwarder.Verdict{}, fmt.Errorf("nats audit %s: %w", subject, err)
	}
	// Consumers lost with the data are awaited: those missing when the
	// stream went missing or was recreated, or, judged again, when the
	// messages show a loss; not on a mere removal (see awaitedConsumers).
	awaited := awaitedConsumers(st, l, time.Now())
	status, reason := judge(st, l, awaited)
	next := auditState{Consumers: make(map[string]consumerMark, len(l.after)), Awaited: awaited}
	if l.stream {
		next.Created = l.created
	}
	for name, r := range l.after {
		next.Consumers[name] = r.consumerMark
	}
	state, err := json.Marshal(next)
	if err != nil {
		return forwarder.Verdict{}, fmt.Errorf("nats audit %s: %w", subject, err)
	}
	return forwarder.Verdict{State: state, Status: status, Reason: reason}, nil
}

// judge is Check's decision for each held message, and the reason of the
// first loss.
func judge(st *auditState, l look, awaited map[string]int64) ([]forwarder.Status, string) {
	status := make([]forwarder.Status, len(l.seqs))
	reason := ""
	lose := func(i int, why string) {
		status[i] = forwarder.Lost
		if reason == "" {
			reason = why
		}
	}
	// The held sequences, and those found, sorted and distinct, to count
	// them between two sequences.
	held, found := sortedSeqs(l.seqs, nil), sortedSeqs(l.seqs, l.found)
	for i, s := range l.seqs {
		switch {
		case s == 0:
			lose(i, "a receipt holds no stream sequence")
		case l.other[i]:
			lose(i, fmt.Sprintf("sequence %d holds another message: the stream lost its tail and reused the sequence, or was created again", s))
		case l.found[i]:
			if len(awaited) == 0 && acknowledged(l.before, s) {
				status[i] = forwarder.Settled
			}
		case !l.stream:
			lose(i, fmt.Sprintf("stream missing, sequence %d was acknowledged to the forwarder", s))
		case st != nil && !st.Created.Equal(l.created):
			lose(i, fmt.Sprintf("sequence %d missing and the stream was created again since the last audit (created %s, was %s)",
				s, l.created.UTC().Format(time.RFC3339Nano), st.Created.UTC().Format(time.RFC3339Nano)))
		case s > l.last:
			lose(i, fmt.Sprintf("sequence %d missing above the stream's last sequence %d: the stream went back (a store restored from an older copy, a replica behind taking over)", s, l.last))
		case st == nil:
			lose(i, fmt.Sprintf("sequence %d missing and no earlier audit of the stream shows its consumers had it", s))
		case len(awaited) > 0:
			lose(i, fmt.Sprintf("sequence %d removed while consumer %s, lost with the data, has not come back", s, firstName(awaited)))
		default:
			if why := vouch(st, l.after, s, held, found); why != "" {
				lose(i, why)
			} else {
				status[i] = forwarder.Settled // removed after every consumer had it
			}
		}
	}
	return status, reason
}

// awaitedConsumers returns the consumers to await ([forwarder.AwaitLostGroups]):
// those of st missing now when the stream went missing or was recreated,
// or when the messages, judged with the consumers already awaited, show a
// loss. A removal alone (a limit, a purge of acknowledged messages) while
// a consumer was deleted on purpose is no reason to hold the subject.
func awaitedConsumers(st *auditState, l look, now time.Time) map[string]int64 {
	if st == nil {
		return nil
	}
	known := slices.Sorted(maps.Keys(st.Consumers))
	present := func(name string) bool { _, ok := l.after[name]; return ok }
	dataLost := !l.stream || !st.Created.Equal(l.created)
	awaited := forwarder.AwaitLostGroups(known, st.Awaited, present, dataLost, now)
	if !dataLost {
		if status, _ := judge(st, l, awaited); slices.Contains(status, forwarder.Lost) {
			awaited = forwarder.AwaitLostGroups(known, st.Awaited, present, true, now)
		}
	}
	return awaited
}

// firstName is the first of names, sorted: the same one each time, for
// the log.
func firstName(names map[string]int64) string {
	first := ""
	for n := range names {
		if first == "" || n < first {
			first = n
		}
	}
	return first
}

// acknowledged reports whether every consumer's ack floor is at or past
// seq, with at least one consumer: a message nobody reads yet is needed
// by whoever comes.
func acknowledged(readers map[string]reader, seq uint64) bool {
	if len(readers) == 0 {
		return false
	}
	for _, r := range readers {
		if r.Floor < seq {
			return false
		}
	}
	return true
}

// vouch says why the consumers do not show they had seq, a message removed
// from the stream the last Check saw (st); "" when they do. held are the
// held sequences, found those of them found, sorted and distinct.
//
// A consumer delivers its subject's messages in stream order, so one that
// read seq made, since the last Check, at least a delivery for each held
// message after its delivered stream sequence then up to seq, and one for
// each held message found after seq up to its delivered stream sequence
// now (a message still there that it passed, it delivered). Fewer
// deliveries than that, and it did not read seq: a purge or a limit moved
// its ack floor over it. The count is a lower bound (the subject's
// messages not held count too, and redeliveries count as deliveries): a
// consumer it fails surely missed a message, one it passes may still have.
func vouch(st *auditState, readers map[string]reader, seq uint64, held, found []uint64) string {
	if len(readers) == 0 {
		return fmt.Sprintf("sequence %d removed while no consumer reads the subject", seq)
	}
	names := make([]string, 0, len(readers))
	for name := range readers {
		names = append(names, name)
	}
	slices.Sort(names) // the same name each time, for the log
	known := 0
	for _, name := range names {
		r := readers[name]
		if r.Floor < seq {
			return fmt.Sprintf("sequence %d removed before consumer %s acknowledged it", seq, name)
		}
		p, ok := st.Consumers[name]
		if !ok {
			continue // created since the last audit: it starts on what the stream holds
		}
		if !p.Created.Equal(r.Created) || r.Delivered < p.Delivered {
			return fmt.Sprintf("sequence %d removed and consumer %s was created again (or went back) since the last audit: its ack floor does not show it read it", seq, name)
		}
		known++
		if need := between(held, p.Stream, seq) + between(found, seq, r.Stream); r.Delivered-p.Delivered < need {
			return fmt.Sprintf("sequence %d removed, and consumer %s made %d deliveries since the last audit where reading it took at least %d: it did not read it before it went (a purge or a limit moves the ack floor over what it removes)",
				seq, name, r.Delivered-p.Delivered, need)
		}
	}
	if known == 0 {
		return fmt.Sprintf("sequence %d removed and no consumer the last audit saw shows it read it", seq)
	}
	return ""
}

// sortedSeqs is seqs (those whose keep is true, all with a nil keep)
// sorted and distinct, without 0.
func sortedSeqs(seqs []uint64, keep []bool) []uint64 {
	out := make([]uint64, 0, len(seqs))
	for i, s := range seqs {
		if s != 0 && (keep == nil || keep[i]) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// between counts the sorted sequences in (lo, hi].
func between(sorted []uint64, lo, hi uint64) uint64 {
	if hi <= lo {
		return 0
	}
	from, _ := slices.BinarySearch(sorted, lo+1)
	to, _ := slices.BinarySearch(sorted, hi+1)
	return uint64(to - from)
}

// look reads subject's stream: the consumers reading the subject, then
// each held message, then the stream's info, then, when a message was
// missing, the consumers again (their delivery counts after the
// removal). Read in this order, an acknowledgement seen before a message
// was found was made while the message was there.
func (b *natsBackend) look(ctx context.Context, subject string, held []forwarder.Held) (look, error) {
	stream := streamName(b.streamTopic(subject))
	l := look{seqs: make([]uint64, len(held)), found: make([]bool, len(held)), other: make([]bool, len(held))}
	for i, h := range held {
		l.seqs[i], _ = strconv.ParseUint(h.Position, 10, 64) // 0 when unreadable: Lost
	}
	var err error
	if l.before, err = b.readers(ctx, stream, subject); err != nil {
		return l, err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(getParallel)
	for i, seq := range l.seqs {
		if seq == 0 {
			continue
		}
		g.Go(func() error {
			m, err := b.js.GetMsg(stream, seq, nats.Context(gctx))
			switch {
			case errors.Is(err, nats.ErrMsgNotFound), errors.Is(err, nats.ErrStreamNotFound):
				return nil
			case err != nil:
				return fmt.Errorf("get sequence %d: %w", seq, err)
			}
			id := m.Header.Get(wmnats.WatermillUUIDHdr)
			if id == "" {
				id = m.Header.Get(nats.MsgIdHdr)
			}
			if m.Subject != subject || (id != "" && held[i].MessageID != "" && id != held[i].MessageID) {
				l.other[i] = true
			} else {
				l.found[i] = true
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return l, err
	}
	info, err := b.js.StreamInfo(stream, nats.Context(ctx))
	switch {
	case errors.Is(err, nats.ErrStreamNotFound):
		l.after = l.before
		return l, nil
	case err != nil:
		return l, fmt.Errorf("stream info: %w", err)
	}
	l.stream, l.created, l.last = true, info.Created, info.State.LastSeq
	l.after = l.before
	for i := range held {
		if !l.found[i] && !l.other[i] && l.seqs[i] != 0 {
			if l.after, err = b.readers(ctx, stream, subject); err != nil {
				return l, err
			}
			break
		}
	}
	return l, nil
}

// readers reads the consumers of stream that read subject; none when the
// stream is missing.
func (b *natsBackend) readers(ctx context.Context, stream, subject string) (map[string]reader, error) {
	consumers, err := b.consumers(ctx, stream)
	if errors.Is(err, nats.ErrStreamNotFound) {
		return map[string]reader{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := make(map[string]reader, len(consumers))
	for _, c := range consumers {
		if !readsSubject(c.Config, subject) {
			continue
		}
		out[c.Name] = reader{
			consumerMark: consumerMark{Created: c.Created, Delivered: c.Delivered.Consumer, Stream: c.Delivered.Stream},
			Floor:        c.AckFloor.Stream,
		}
	}
	return out, nil
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

// consumers lists stream's consumers with their ack floors and delivery
// counts. nats.go's lister drops errors (its channel just ends), and a
// Check that missed a consumer would settle what that consumer had not
// read: this pages the JetStream API's consumer list itself, and fails on
// any error, and when a clustered stream's list names consumers whose
// leaders did not answer (missing).
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
			Missing   []string             `json:"missing"`
			Error     *nats.APIError       `json:"error"`
		}
		if err := json.Unmarshal(msg.Data, &resp); err != nil {
			return nil, fmt.Errorf("list consumers: %w", err)
		}
		if resp.Error != nil {
			if resp.Error.ErrorCode == nats.JSErrCodeStreamNotFound {
				return nil, nats.ErrStreamNotFound
			}
			return nil, fmt.Errorf("list consumers: %w", resp.Error)
		}
		if len(resp.Missing) > 0 {
			return nil, fmt.Errorf("list consumers: consumers %v did not answer", resp.Missing)
		}
		all = append(all, resp.Consumers...)
		if len(resp.Consumers) == 0 || len(all) >= resp.Total {
			return all, nil
		}
	}
}
