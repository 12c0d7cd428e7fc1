package forwarder

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Receipts of the broker audit are recorded with the cursor, not with each
// batch. A row of outbox_receipts per batch cost, at a service's everyday
// rate of one event per batch, about 500 B of WAL per event (the row, its
// key, the commit record of a transaction that wrote nothing else, the
// audit's delete of it) and a dead tuple: more than everything else the
// relay writes for it. Recorded at the lease tick, the receipts of every
// batch since the last tick go in one row (of up to receiptsPerRow).
//
// That is as safe as a row per batch: what the audit must never miss is a
// message the broker acknowledged and whose row the forwarder will not
// publish again. A batch's new and late rows are published again, after
// a crash, until a lease tick records the cursor past them; the tick that
// records it writes their receipts in the same transaction (they were
// added before the cursor moved, and the tick takes them after reading
// it). Rows read from outbox_failures are not covered by the cursor (their
// failure row goes with the batch): their receipts are written with the
// batch, as before. So are a batch's receipts when too many wait already
// (maxPendingReceipts: a lease loop stuck while claims go on).

// maxPendingReceipts bounds the receipts waiting in memory for a lease
// tick. A variable for the tests.
var maxPendingReceipts = 100_000

// receiptSet is receipts of published rows, as outbox_receipts keeps
// them: parallel arrays.
type receiptSet struct {
	ids               []int64
	topics, positions []string
}

func (s *receiptSet) add(id int64, r Receipt) {
	s.ids = append(s.ids, id)
	s.topics = append(s.topics, r.BrokerTopic)
	s.positions = append(s.positions, r.Position)
}

func (s *receiptSet) addAll(o receiptSet) {
	s.ids = append(s.ids, o.ids...)
	s.topics = append(s.topics, o.topics...)
	s.positions = append(s.positions, o.positions...)
}

func (s receiptSet) len() int { return len(s.ids) }

// receiptsPerRow bounds the receipts of one row of a receipts table. The
// audit reads whole rows and bounds its work by rows and receipts
// (auditRowLimit, auditHeldLimit): a tick's receipts at a drain's rate
// (tens of thousands) in one row would make every audit hand them all to
// one Check, past its timeout, again and again.
const receiptsPerRow = 1000

// QueueReceipts adds to b the inserts into s's receipts table of the
// receipts of rows ids (topics[i] and positions[i] ids[i]'s), in rows of at
// most 1,000 receipts: the audit reads whole rows and bounds its work by
// rows and receipts. Nothing when ids is empty.
func (s AuditStore) QueueReceipts(b *pgx.Batch, ids []int64, topics, positions []string) {
	for lo := 0; lo < len(ids); lo += receiptsPerRow {
		hi := min(lo+receiptsPerRow, len(ids))
		b.Queue(`INSERT INTO `+s.Receipts+` (`+s.IDs+`, broker_topics, positions) VALUES ($1, $2, $3)`,
			ids[lo:hi], topics[lo:hi], positions[lo:hi])
	}
}

// queue adds the inserts of s into outbox_receipts to b.
func (s receiptSet) queue(b *pgx.Batch) {
	outboxAuditStore.QueueReceipts(b, s.ids, s.topics, s.positions)
}

// pendingReceipts are the receipts of committed batches not yet written.
// saving is held by whoever writes them (the lease tick, a flush) from
// taking them to the end of the transaction that writes them: a tick must
// not record the cursor past rows whose receipts another writer took and
// has not committed.
type pendingReceipts struct {
	saving sync.Mutex

	mu  sync.Mutex
	set receiptSet
}

func (p *pendingReceipts) add(s receiptSet) {
	if s.len() == 0 {
		return
	}
	p.mu.Lock()
	p.set.addAll(s)
	p.mu.Unlock()
}

func (p *pendingReceipts) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.set.len()
}

// take empties p and returns what it held. Call with saving held.
func (p *pendingReceipts) take() receiptSet {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.set
	p.set = receiptSet{}
	return s
}

// flushReceipts writes the receipts waiting in memory, in a transaction of
// their own: the audit calls it first, so that it judges this instance's
// receipts without waiting for a lease tick.
func (f *Forwarder) flushReceipts(ctx context.Context) error {
	f.receipts.saving.Lock()
	defer f.receipts.saving.Unlock()
	s := f.receipts.take()
	if s.len() == 0 {
		return nil
	}
	err := pgx.BeginFunc(ctx, f.cfg.Pool, func(tx pgx.Tx) error { return saveReceipts(ctx, tx, s) })
	if err != nil {
		f.receipts.add(s)
	}
	return err
}
