package walrelay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/backoff"
	"github.com/outflow-dev/outflow/internal/subloop"
)

// Relay reads the outbox's WAL messages through a replication slot and
// publishes their events. Create it with [New], run it with [Relay.Run];
// run several for availability: one reads, the others stand by.
type Relay struct {
	cfg     Config
	metrics *metrics

	mu      sync.Mutex
	running bool
	leader  bool
	slotErr error // ErrSlotLost, wrapped; nil when the slot is fine
	readErr error // the reader's last failure, nil after a good batch
	stop    context.CancelFunc
	done    chan struct{}

	// auditor is Broker as a forwarder.Auditor when the audit is on (an
	// Auditor, AuditInterval positive, a history kept), nil otherwise.
	// retryNow: an audit put events back; the reader retries parked
	// events at once.
	auditor  forwarder.Auditor
	retryNow atomic.Bool

	// The reader goroutine's own.
	historyUpTo lsn             // history is written for transactions ending after it
	partitions  map[string]bool // history partitions known to exist
	lastRetry   time.Time
	lastPrune   time.Time
	lastAudit   time.Time
}

// New validates cfg and returns a Relay. It starts nothing.
func New(cfg Config) (*Relay, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, metrics: m, partitions: make(map[string]bool), lastAudit: time.Now()}
	if a, ok := cfg.Broker.(forwarder.Auditor); ok && cfg.AuditInterval > 0 && cfg.HistoryRetention > 0 {
		r.auditor = a
	}
	return r, nil
}

// errStandby: another relay holds the reader's lock.
var errStandby = errors.New("walrelay: another relay reads the slot")

// Run relays until ctx is done (or Close), then finishes the batch in
// flight, releases the reader's lock and returns nil. While another relay
// reads, it stands by. A lost slot does not end it: it reports
// [ErrSlotLost] through Ready, logs, and resumes once the slot was
// recovered ([RecoverSlot]).
func (r *Relay) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.mu.Lock()
	if r.running {
		r.mu.Unlock()
		return errors.New("walrelay: already running")
	}
	r.running, r.stop, r.done = true, cancel, make(chan struct{})
	done := r.done
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.running, r.leader, r.stop = false, false, nil
		r.mu.Unlock()
		r.metrics.leader.Set(0)
		close(done)
	}()

	r.cfg.Logger.Info("wal relay started", "slot", r.cfg.SlotName, "prefix", r.cfg.Prefix)
	var wg sync.WaitGroup
	wg.Go(func() { r.statsLoop(ctx) })
	if r.cfg.HistoryRetention > 0 {
		wg.Go(func() { r.bodiesLoop(ctx) })
	}
	for ctx.Err() == nil {
		err := r.lead(ctx)
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, errStandby):
			// The database answered: a standby that failed before is
			// ready again.
			r.setReadErr(nil)
		case errors.Is(err, ErrSlotLost):
			r.setSlotErr(err)
		case err != nil:
			r.setReadErr(err)
			r.cfg.Logger.Warn("wal relay", "error", err.Error())
		}
		subloop.Sleep(ctx, r.cfg.StandbyRetry)
	}
	wg.Wait()
	r.cfg.Logger.Info("wal relay stopped", "slot", r.cfg.SlotName)
	return nil
}

// Close stops a running Run and waits for it to return.
func (r *Relay) Close() error {
	r.mu.Lock()
	stop, done := r.stop, r.done
	r.mu.Unlock()
	if stop == nil {
		return nil
	}
	stop()
	<-done
	return nil
}

// Ready returns nil while Run runs and the slot is readable, whether this
// relay reads or stands by; otherwise why not: not running, the slot lost
// ([ErrSlotLost]), or the reader failing.
func (r *Relay) Ready() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case !r.running:
		return errors.New("walrelay: not running")
	case r.slotErr != nil:
		return r.slotErr
	case r.readErr != nil:
		return fmt.Errorf("walrelay: reading the slot fails: %w", r.readErr)
	}
	return nil
}

// Leader reports whether this relay holds the reader's lock.
func (r *Relay) Leader() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leader
}

func (r *Relay) setLeader(v bool) {
	r.mu.Lock()
	r.leader = v
	r.mu.Unlock()
	if v {
		r.metrics.leader.Set(1)
	} else {
		r.metrics.leader.Set(0)
	}
}

// setSlotErr records the slot's state; a change is logged, a loss at Error.
func (r *Relay) setSlotErr(err error) {
	r.mu.Lock()
	was := r.slotErr
	r.slotErr = err
	r.mu.Unlock()
	switch {
	case err != nil && was == nil:
		r.cfg.Logger.Error("wal relay: replication slot lost", "slot", r.cfg.SlotName, "error", err.Error())
	case err == nil && was != nil:
		r.cfg.Logger.Info("wal relay: replication slot readable again", "slot", r.cfg.SlotName)
	}
}

func (r *Relay) setReadErr(err error) {
	r.mu.Lock()
	r.readErr = err
	r.mu.Unlock()
}

// lead takes the reader's lock on a connection of its own and reads until
// ctx is done or reading fails; errStandby when another relay has it.
func (r *Relay) lead(ctx context.Context) (err error) {
	conn, err := r.cfg.Pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire the reader's connection: %w", err)
	}
	locked := false
	defer func() {
		if locked {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if _, uerr := conn.Exec(uctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, lockKey(r.cfg.SlotName)); uerr != nil {
				// The lock is the session's: ending the session frees it.
				_ = conn.Hijack().Close(uctx)
				return
			}
		}
		conn.Release()
	}()
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`, lockKey(r.cfg.SlotName)).Scan(&locked); err != nil {
		return fmt.Errorf("try the reader's lock: %w", err)
	}
	if !locked {
		return errStandby
	}
	r.setLeader(true)
	defer r.setLeader(false)
	if err := r.ensureSlot(ctx, conn.Conn()); err != nil {
		return err
	}
	r.setSlotErr(nil)
	r.cfg.Logger.Info("wal relay reads the slot", "slot", r.cfg.SlotName)
	return r.read(ctx, conn.Conn())
}

// retryTick is how often the reader looks for parked events due.
const retryTick = 200 * time.Millisecond

// pruneTick is how often the reader drops history partitions past
// retention.
const pruneTick = time.Hour

// read is the reader's loop.
func (r *Relay) read(ctx context.Context, conn *pgx.Conn) error {
	idle := r.cfg.MinPollInterval
	outages := 0 // broker outages in a row
	lastConfirm := time.Now()
	for ctx.Err() == nil {
		if time.Since(r.lastRetry) >= retryTick || r.retryNow.Swap(false) {
			r.lastRetry = time.Now()
			if err := r.retryParked(ctx, conn); err != nil && ctx.Err() == nil {
				r.cfg.Logger.Warn("wal relay: retry parked events", "error", err.Error())
			}
		}
		if r.cfg.HistoryRetention > 0 && time.Since(r.lastPrune) >= pruneTick {
			r.lastPrune = time.Now()
			r.pruneHistory(ctx, conn)
		}
		if r.auditor != nil && time.Since(r.lastAudit) >= r.cfg.AuditInterval {
			r.lastAudit = time.Now()
			if err := r.Audit(ctx); err != nil && ctx.Err() == nil {
				r.cfg.Logger.Warn("wal relay: broker audit", "error", err.Error())
			}
		}
		n, err := r.batch(ctx, conn)
		if n > 0 {
			lastConfirm = time.Now()
			idle = r.cfg.MinPollInterval
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if conn.IsClosed() {
				return err
			}
			st, serr := readSlot(ctx, conn, r.cfg.SlotName)
			if serr == nil {
				r.metrics.setSlot(st)
				if lerr := st.lostErr(r.cfg.SlotName); lerr != nil {
					return lerr
				}
			}
			if errors.Is(err, forwarder.ErrBrokerUnavailable) {
				r.metrics.brokerUnavailable.Inc()
			} else {
				r.setReadErr(err)
			}
			outages++
			wait := backoff.Delay(backoff.ReconnectBase, r.cfg.OutageBackoffMax, outages)
			r.cfg.Logger.Warn("wal relay batch", "error", err.Error(), "retry_in", wait)
			subloop.Sleep(ctx, wait)
			continue
		}
		outages = 0
		r.setReadErr(nil)
		if n > 0 {
			continue
		}
		if time.Since(lastConfirm) >= r.cfg.HeartbeatInterval {
			// Nothing of ours in the WAL for a while: a message of the
			// relay's own gives it a commit to confirm, so the slot does
			// not hold back the WAL everything else writes.
			lastConfirm = time.Now()
			if _, err := conn.Exec(ctx, `SELECT pg_logical_emit_message(true, $1, '')`, r.cfg.Prefix+".heartbeat"); err != nil {
				r.cfg.Logger.Warn("wal relay: heartbeat", "error", err.Error())
			} else {
				r.metrics.heartbeats.Inc()
			}
			continue
		}
		subloop.Sleep(ctx, idle)
		idle = min(2*idle, r.cfg.PollInterval)
	}
	return nil
}

// item is one event of a batch.
type item struct {
	txn int // index in the batch's transactions
	pos int // index in its transaction
	ev  outbox.WALEvent
	key string
	out forwarder.Outgoing
}

// errParkedAhead marks an event whose aggregate has events in
// outbox_wal_parked: it queues behind them.
var errParkedAhead = errors.New("held behind its aggregate's parked event")

// batch reads whole transactions from the slot, publishes their events,
// parks what the broker refused, and confirms the slot up to the last
// transaction fully handled. It returns how many transactions it
// confirmed; an error wrapping forwarder.ErrBrokerUnavailable when the
// broker stopped it short.
func (r *Relay) batch(ctx context.Context, conn *pgx.Conn) (int, error) {
	start := time.Now()
	rows, err := conn.Query(ctx, `SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, $2,
		'proto_version', '1', 'publication_names', $3, 'messages', 'true')`,
		r.cfg.SlotName, r.cfg.MaxChanges, r.cfg.Publication)
	if err != nil {
		return 0, fmt.Errorf("read the slot: %w", err)
	}
	var a txnAssembler
	for rows.Next() {
		var data []byte // Scan copies: the message content outlives the row
		if err := rows.Scan(&data); err != nil {
			rows.Close()
			return 0, fmt.Errorf("read the slot: %w", err)
		}
		if err := a.add(data); err != nil {
			rows.Close()
			return 0, err
		}
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("read the slot: %w", err)
	}
	txns := a.done
	if len(txns) == 0 {
		return 0, nil
	}
	items := r.decode(txns)

	// The rest runs even if ctx ends now: finishing the batch is cheaper
	// than publishing it twice.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.PublishTimeout)
	defer cancel()
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.ShutdownTimeout)
	defer wcancel()

	held, err := heldAggregates(wctx, conn)
	if err != nil {
		return 0, err
	}
	// The history is written while the broker publishes, on a connection
	// of the pool: off the producers' path and off the publish's.
	histDone := make(chan error, 1)
	var hist []item
	if r.cfg.HistoryRetention > 0 {
		for _, it := range items {
			if txns[it.txn].end > r.historyUpTo {
				hist = append(hist, it)
			}
		}
	}
	var histIDs map[eventKey]int64
	go func() {
		var err error
		histIDs, err = r.writeHistory(wctx, txns, hist)
		histDone <- err
	}()

	keys := make([]string, len(items))
	msgs := make([]forwarder.Outgoing, len(items))
	results := make([]error, len(items))
	for i, it := range items {
		keys[i], msgs[i] = it.key, it.out
		if held[it.key] {
			results[i] = errParkedAhead
		}
	}
	receipts := r.publishWaves(pctx, keys, msgs, results)
	herr := <-histDone

	// The slot may move past the transactions before the first one with
	// an event not acknowledged for the broker's reason (an outage, or
	// held behind one): that one is read again.
	const refused, unavailable = 1, 2
	cause := make(map[string]int)
	confirm := len(txns)
	var unavailableErr error
	for i, it := range items {
		err := results[i]
		switch {
		case err == nil:
		case errors.Is(err, errParkedAhead):
			cause[it.key] = refused
		case errors.Is(err, forwarder.ErrHeld):
			if cause[it.key] == unavailable {
				confirm = min(confirm, it.txn)
			}
		case errors.Is(err, forwarder.ErrBrokerUnavailable):
			if cause[it.key] == 0 {
				cause[it.key] = unavailable
			}
			if unavailableErr == nil {
				unavailableErr = err
			}
			confirm = min(confirm, it.txn)
		default:
			if cause[it.key] == 0 {
				cause[it.key] = refused
			}
		}
	}
	// What the broker refused, and what its aggregate holds behind it,
	// is copied into the parked table before the slot moves past it.
	var park []parkRow
	now := time.Now()
	for i, it := range items {
		err := results[i]
		if it.txn >= confirm || err == nil || cause[it.key] != refused {
			continue
		}
		p := parkRow{item: it, commitLSN: txns[it.txn].commitLSN}
		if !errors.Is(err, forwarder.ErrHeld) && !errors.Is(err, errParkedAhead) {
			msg := truncate(err.Error(), 2000)
			p.attempts, p.lastError = 1, &msg
			due := now.Add(r.retryDelay(1))
			p.nextAttemptAt = &due
			if r.cfg.MaxAttempts <= 1 {
				p.parkedAt = &now
			}
			r.metrics.failedAttempts.WithLabelValues(it.out.Topic).Inc()
			r.cfg.Logger.Warn("wal relay: the broker refused an event; it and its aggregate's later events wait in outbox_wal_parked",
				"message_id", it.ev.MessageID, "aggregate_type", it.ev.AggregateType, "aggregate_id", it.ev.AggregateID, "error", err.Error())
		}
		park = append(park, p)
	}
	if herr != nil {
		return 0, fmt.Errorf("write history: %w", herr)
	}
	if confirm == 0 {
		return 0, unavailableErr
	}
	if err := insertParked(wctx, conn, park); err != nil {
		return 0, err
	}
	// The receipts of what the broker took, before the slot moves past
	// it: until then, a crash reads and publishes it again.
	if receipts != nil {
		if err := r.saveReceipts(wctx, conn, txns, items, results, receipts, histIDs); err != nil {
			return 0, err
		}
	}
	to := txns[confirm-1].end
	if _, err := conn.Exec(wctx, `SELECT pg_replication_slot_advance($1, $2::pg_lsn)`, r.cfg.SlotName, to.String()); err != nil {
		return 0, fmt.Errorf("confirm the slot to %s: %w", to, err)
	}
	if _, err := conn.Exec(wctx, `UPDATE outbox_wal_slots SET confirmed_lsn = $2::pg_lsn, confirmed_at = now() WHERE slot_name = $1`,
		r.cfg.SlotName, to.String()); err != nil {
		// The record only says where a loss would start: a stale one
		// starts it earlier, never later.
		r.cfg.Logger.Warn("wal relay: record the confirmed position", "error", err.Error())
	}
	if len(hist) > 0 {
		r.historyUpTo = max(r.historyUpTo, txns[len(txns)-1].end)
		r.metrics.historyRows.Add(float64(len(hist)))
	}
	for i, it := range items {
		if it.txn < confirm && results[i] == nil {
			r.metrics.published.WithLabelValues(it.out.Topic).Inc()
		}
	}
	r.metrics.batchSeconds.Observe(time.Since(start).Seconds())
	return confirm, unavailableErr
}

// publishWaves publishes msgs in the forwarder's waves, with receipts
// (returned, receipts[i] msgs[i]'s when results[i] is nil) when the audit
// is on, nil otherwise.
func (r *Relay) publishWaves(ctx context.Context, keys []string, msgs []forwarder.Outgoing, results []error) []forwarder.Receipt {
	if r.auditor == nil {
		forwarder.PublishWaves(ctx, r.cfg.Broker, keys, msgs, results)
		return nil
	}
	receipts := make([]forwarder.Receipt, len(msgs))
	forwarder.PublishWavesReceipts(ctx, r.auditor, keys, msgs, results, receipts, func(m forwarder.Outgoing) {
		r.cfg.Logger.Error("wal relay: the Auditor acknowledged a message without a receipt (see brokertest.RunAudit)",
			"message_id", m.Message.UUID)
	})
	return receipts
}

// decode turns the transactions' messages with the writers' prefix into
// events; a message that is no WALMessage is logged at Error and counted
// (its position is in the log, to find it with pg_waldump).
func (r *Relay) decode(txns []txn) []item {
	var items []item
	for ti, t := range txns {
		pos := 0
		for _, m := range t.messages {
			if m.prefix != r.cfg.Prefix {
				continue // a heartbeat, or another application's message
			}
			var wm outbox.WALMessage
			err := json.Unmarshal(m.content, &wm)
			if err == nil && wm.V != outbox.WALMessageVersion {
				err = fmt.Errorf("envelope version %d, this relay reads %d", wm.V, outbox.WALMessageVersion)
			}
			if err != nil {
				r.metrics.undecodable.Inc()
				r.cfg.Logger.Error("wal relay: a message with the outbox's prefix is no WALMessage; skipped",
					"lsn", m.lsn.String(), "xid", t.xid, "error", err.Error())
				continue
			}
			for _, ev := range wm.Events {
				pos++
				items = append(items, item{txn: ti, pos: pos, ev: ev, key: ev.AggregateType + "\x00" + ev.AggregateID, out: outgoing(ev)})
			}
		}
	}
	return items
}

// outgoing is the broker message of ev: as forwarder.Message builds a
// row's, the envelope in metadata over the event's own.
func outgoing(ev outbox.WALEvent) forwarder.Outgoing {
	md := make(message.Metadata, len(ev.Metadata)+8)
	for k, v := range ev.Metadata {
		md[k] = v
	}
	env := events.Envelope{MessageID: ev.MessageID, EventType: ev.EventType, AggregateType: ev.AggregateType,
		AggregateID: ev.AggregateID, AggregateVersion: ev.AggregateVersion, OccurredAt: ev.OccurredAt}
	for k, v := range env.Metadata() {
		md[k] = v
	}
	msg := message.NewMessage(ev.MessageID, []byte(ev.Payload))
	msg.Metadata = md
	return forwarder.Outgoing{Topic: ev.Topic, AggregateID: ev.AggregateID, Message: msg}
}

// truncate cuts s to at most n bytes of valid UTF-8 without NUL bytes.
func truncate(s string, n int) string {
	b := make([]rune, 0, len(s))
	size := 0
	for _, c := range s {
		if c == 0 || c == 0xFFFD {
			continue
		}
		l := len(string(c))
		if size+l > n {
			break
		}
		size += l
		b = append(b, c)
	}
	return string(b)
}
