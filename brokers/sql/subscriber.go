package sql

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/internal/backoff"
	"github.com/outflow-dev/outflow/internal/subloop"
)

// sqlSubscriber is Outflow's subscriber on watermill-sql's tables: the same
// message and offsets tables, the same (transaction id, offset) order and
// position per group, the same row lock serialising a group, so a
// deployment can move between it and watermill-sql's subscriber (stop one,
// start the other) and brokers.Trimmer works on either's offsets.
//
// It exists because watermill-sql's subscriber hands a poll's rows over one
// at a time, each after the previous ack, inside its poll transaction: every
// event cost one commit of the idempotency middleware's, and a group could
// not go past a few hundred events/s (763 of 1,000 events/s handled, p99
// 3.5 s in `outflow-bench brokers`). This one hands a whole read to the
// router at once, as the Redis and NATS subscribers do, so the middleware
// shares its transactions; it commits the group's position once per read,
// after the longest acked prefix. It also looks for work with a read-only
// query first, so that an idle or waiting subscription spends no
// transaction id, and it is woken by a NOTIFY that the forwarder's side
// sends after each batch's commit (never inside a business transaction).
type sqlSubscriber struct {
	b           *sqlBackend
	group       string
	batchSize   int
	ackDeadline time.Duration
	resend      time.Duration

	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	mu     sync.Mutex
	closed bool
}

// Subscriber is one consumer group: the row group in the topic's offsets
// table. consumer is not used: the instances of a group take turns on that
// row's lock, so they are standbys, not parallel consumers.
func (b *sqlBackend) Subscriber(group, consumer string, opts brokers.SubscriberOptions) (message.Subscriber, error) {
	opts = opts.WithDefaults()
	s := b.cfg.SQL
	if s.AckDeadline == 0 {
		s.AckDeadline = opts.ClaimIdle
	}
	if s.SubscribeBatchSize == 0 {
		s.SubscribeBatchSize = opts.InFlight
	}
	if group == "" || len(group) > 255 {
		return nil, fmt.Errorf("sql subscriber: group %q must be 1 to 255 characters (the offsets table's consumer_group)", group)
	}
	return &sqlSubscriber{b: b, group: group, batchSize: s.SubscribeBatchSize, ackDeadline: s.AckDeadline,
		resend: time.Second, closing: make(chan struct{})}, nil
}

// Subscribe creates topic's tables and the group's offsets row if missing
// and delivers the topic's messages until ctx is done or Close is called;
// the channel is closed then.
func (s *sqlSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := s.b.ensureTables(topic); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, wmsql.ErrSubscriberClosed
	}
	b := s.b
	q := b.queries(topic)
	// The row every instance of the group locks, as watermill-sql creates
	// it: without it there would be nothing to lock.
	if _, err := b.pool.Exec(ctx, q.init, s.group); err != nil {
		return nil, fmt.Errorf("sql subscriber: offsets row of group %q on %q: %w", s.group, topic, err)
	}
	if err := b.reserve(topic); err != nil {
		return nil, err
	}
	wake, unwatch := b.watch(topic)
	return subloop.Start(ctx, s.closing, &s.wg, func(ctx context.Context, out chan<- *message.Message) {
		defer b.release(1)
		defer unwatch()
		s.consume(ctx, topic, q, wake, out)
	}), nil
}

// Close stops every subscription and waits for them: a read in progress
// commits the position of what was acked so far; what was handed out and
// not acked is read again by the next instance. It is safe to call more
// than once.
func (s *sqlSubscriber) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.closeOnce.Do(func() { close(s.closing) })
	s.wg.Wait()
	return nil
}

// sqlProbe is what a subscription's read-only look finds past its group's
// position.
type sqlProbe int

const (
	sqlNothing sqlProbe = iota // no row
	sqlHeld                    // rows, not readable yet: an older transaction is still open
	sqlReady                   // a row to read
)

func (s *sqlSubscriber) consume(ctx context.Context, topic string, q sqlQueries, wake <-chan struct{}, out chan<- *message.Message) {
	logger := s.b.cfg.Logger.With("topic", topic, "group", s.group)
	failures, held := 0, 0
	var heldSince time.Time
	for ctx.Err() == nil {
		wait := s.b.cfg.SQL.PollInterval
		p, err := s.probe(ctx, q)
		if err == nil && p == sqlReady {
			_, err = s.read(ctx, q, out)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			logger.Error("sql subscriber: read failed; retrying", "error", err, "attempt", failures)
			if !subloop.Sleep(ctx, backoff.Reconnect(failures)) {
				return
			}
			continue
		}
		failures = 0
		switch p {
		case sqlReady:
			held = 0
			continue // more may be waiting
		case sqlHeld:
			// A transaction that began before the row's is still open,
			// in any database of the server (transaction ids are the
			// cluster's).
			held++
			if held == 1 {
				heldSince = time.Now()
			}
			wait = heldWait(held, time.Since(heldSince), wait)
		default:
			held = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// heldWait is the wait before the next look when the next row has been
// held by an older open transaction for the held-th look in a row, for a
// streak that began heldFor ago; poll is the idle poll interval.
//
// Under load there nearly always is such a transaction (the forwarder's
// claim, open while it publishes; any producer's), each milliseconds from
// its end, and no notification says when the last of them ends: the
// forwarder's NOTIFY comes before. So a streak younger than heldFast
// looks every heldStep at most (a look is one read-only index probe), and
// only an older one, a long transaction, backs off towards poll or a
// second. Backing off from the first look put a held row's wait at 64-128
// ms after a few looks: commit-to-handled p99 of 46-103 ms at 1,000
// events/s in outflow-bench brokers, against 39-64 ms this way.
func heldWait(held int, heldFor, poll time.Duration) time.Duration {
	if heldFor < heldFast {
		return backoff.Delay(time.Millisecond, heldStep, held)
	}
	return backoff.Delay(heldStep, min(poll, time.Second), held)
}

const (
	heldFast = time.Second
	heldStep = 5 * time.Millisecond
)

// probe looks past the group's position without a lock or a transaction
// id: a poll that finds nothing costs a read only.
func (s *sqlSubscriber) probe(ctx context.Context, q sqlQueries) (sqlProbe, error) {
	var visible bool
	err := s.b.pool.QueryRow(ctx, q.probe, s.group).Scan(&visible)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return sqlNothing, nil
	case err != nil:
		return 0, fmt.Errorf("look for messages: %w", err)
	case !visible:
		return sqlHeld, nil
	}
	return sqlReady, nil
}

type sqlRow struct {
	offset int64
	xid    string // xid8 as text: pgx has no codec for it
	msg    *message.Message
}

// read takes the group's lock, reads up to batchSize readable rows after
// its position, hands them all over, waits until every one is acked (or
// the ack deadline, or the end of the subscription) and moves the position
// past the longest acked prefix, in the transaction that holds the lock.
// A nacked message is handed over again after the resend interval. It
// returns how many rows it handed over.
func (s *sqlSubscriber) read(ctx context.Context, q sqlQueries, out chan<- *message.Message) (int, error) {
	tx, err := s.b.pool.Begin(ctx) // READ COMMITTED: after waiting on the lock, the position read is the latest
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx) // after Commit, a no-op
	}()
	var (
		xid, syncOff string
		offset       int64
	)
	if err := tx.QueryRow(ctx, q.lock, s.group).Scan(&xid, &offset, &syncOff); err != nil {
		return 0, fmt.Errorf("lock the group's position: %w", err)
	}
	rows, err := tx.Query(ctx, q.read, xid, offset, s.batchSize)
	if err != nil {
		return 0, fmt.Errorf("read messages: %w", err)
	}
	var batch []sqlRow
	for rows.Next() {
		var (
			r         sqlRow
			uuid      string
			payload   []byte
			metadata  []byte
			isVisible bool
		)
		if err := rows.Scan(&r.offset, &r.xid, &uuid, &payload, &metadata, &isVisible); err != nil {
			rows.Close()
			return 0, fmt.Errorf("read messages: %w", err)
		}
		if !isVisible {
			break // and so are all after it: the order is the transaction id's
		}
		r.msg = message.NewMessage(uuid, payload)
		if metadata != nil {
			if err := json.Unmarshal(metadata, &r.msg.Metadata); err != nil {
				// watermill-sql stops at such a row too: skipping it would
				// lose a message, and it cannot be decoded by a retry.
				rows.Close()
				return 0, fmt.Errorf("message %s (offset %d): metadata is not a JSON object of strings: %w", uuid, r.offset, err)
			}
		}
		batch = append(batch, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("read messages: %w", err)
	}
	acked := s.deliver(ctx, batch, out)

	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if acked > 0 {
		last := batch[acked-1]
		if _, err := tx.Exec(cctx, q.ack, last.offset, last.xid, s.group); err != nil {
			return len(batch), fmt.Errorf("store the position (%d acked messages will be read again): %w", acked, err)
		}
	}
	if err := tx.Commit(cctx); err != nil {
		return len(batch), fmt.Errorf("commit the position (%d acked messages will be read again): %w", acked, err)
	}
	return len(batch), nil
}

type sqlSettled struct {
	i   int
	ack bool
}

// deliver hands the rows over and waits for their acks; it returns the
// length of the acked prefix. The rows of one aggregate (metadata
// aggregate_type and aggregate_id, as the forwarder writes them) go one at
// a time, lowest aggregate_version first, each once the previous is acked:
// handed over together, they raced to the middleware, and a version that
// reached it before its predecessor was held as a gap for GapRetryDelay
// (1 s); and versions committed out of order in the outbox come in order.
// The first rows of every aggregate go at once, in table order. A message's context ends when it is settled or the subscription
// ends, not with the read: a handler still running when the read ends (ack
// deadline) runs to its end, and the message read again is dropped by the
// middleware as a duplicate.
func (s *sqlSubscriber) deliver(ctx context.Context, batch []sqlRow, out chan<- *message.Message) int {
	if len(batch) == 0 {
		return 0
	}
	// The read ends at the ack deadline, even while a message waits to be
	// taken (a router that stopped reading): its open transaction holds
	// back the rows of every topic of the server.
	rctx, endRead := context.WithTimeout(ctx, s.ackDeadline)
	defer endRead()
	settled := make(chan sqlSettled, len(batch))
	sent := make([]*message.Message, len(batch)) // the last copy handed over
	send := func(i int, m *message.Message) bool {
		mctx, cancel := context.WithCancel(ctx)
		m.SetContext(mctx)
		select {
		case out <- m:
		case <-rctx.Done():
			cancel()
			return false
		}
		sent[i] = m
		go func() {
			defer cancel()
			var r sqlSettled
			select {
			case <-m.Acked():
				r = sqlSettled{i, true}
			case <-m.Nacked():
				r = sqlSettled{i, false}
			case <-ctx.Done():
				return
			}
			select {
			case settled <- r:
			case <-rctx.Done(): // the read has ended: a late ack counts next time
			}
		}()
		return true
	}
	// next[i] is the row of i's aggregate that waits for i's ack, or -1.
	next := make([]int, len(batch))
	chains := map[string][]int{}
	var first []int
	for i, r := range batch {
		next[i] = -1
		if key := sqlAggregate(r.msg); key != "" {
			chains[key] = append(chains[key], i)
		} else {
			first = append(first, i)
		}
	}
	for _, chain := range chains {
		slices.SortStableFunc(chain, func(a, b int) int { return cmp.Compare(sqlVersion(batch[a].msg), sqlVersion(batch[b].msg)) })
		for k := 1; k < len(chain); k++ {
			next[chain[k-1]] = chain[k]
		}
		first = append(first, chain[0])
	}
	slices.Sort(first)
	acked := make([]bool, len(batch))
	pending := len(batch)
	resend := make(chan int)
	for _, i := range first {
		if !send(i, batch[i].msg) {
			pending = -1 // the read ended while handing out
			break
		}
	}
wait:
	for pending > 0 {
		select {
		case r := <-settled:
			if !r.ack {
				time.AfterFunc(s.resend, func() {
					select {
					case resend <- r.i:
					case <-rctx.Done():
					}
				})
				continue
			}
			if acked[r.i] {
				continue
			}
			acked[r.i] = true
			pending--
			if j := next[r.i]; j >= 0 && !send(j, batch[j].msg) {
				break wait
			}
		case i := <-resend:
			if !send(i, batch[i].msg.Copy()) {
				break wait
			}
		case <-rctx.Done():
			break wait
		}
	}
	n, unacked := 0, 0
	for i := range batch {
		if !acked[i] && !isAcked(sent[i]) {
			unacked++
		} else if n == i {
			n++
		}
	}
	if ctx.Err() == nil && rctx.Err() != nil {
		s.b.cfg.Logger.Warn("sql subscriber: messages not acked within the ack deadline are read again",
			"group", s.group, "unacked", unacked, "ack_deadline", s.ackDeadline)
	}
	return n
}

// isAcked reports whether m was acked, without waiting: an ack that came as
// the read ended still counts.
func isAcked(m *message.Message) bool {
	if m == nil {
		return false
	}
	select {
	case <-m.Acked():
		return true
	default:
		return false
	}
}

// sqlVersion is a message's aggregate version, 0 when its metadata does not
// say: it then keeps its place in the table's order.
func sqlVersion(m *message.Message) int64 {
	v, _ := strconv.ParseInt(m.Metadata.Get(events.AggregateVersionKey), 10, 64)
	return v
}

// sqlAggregate is the aggregate a message belongs to, "" when its metadata
// does not say (it is then ordered with nothing).
func sqlAggregate(m *message.Message) string {
	id := m.Metadata.Get(events.AggregateIDKey)
	if id == "" {
		return ""
	}
	return m.Metadata.Get(events.AggregateTypeKey) + "\x00" + id
}
