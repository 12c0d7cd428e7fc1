package forwarder

import (
	"maps"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// cursor is where the forwarder stands in the outbox: which committed rows
// it has published, without a mark on any row (see "Cursors" in
// docs/forwarder.md). Only the work loop touches it, but for durable, which the
// lease loop reads, and published, which it drains.
//
// Rows are read in id order above each partition's high. An id is drawn
// after its transaction has a transaction id (migration 00011). A claim
// reads L, the id sequence's last value, then R, the transactions running
// (each holds a lock on its own transaction id: pg_locks), then takes its
// snapshot S: a row with an id at or below L that S does not show belongs
// to a transaction of R. (S's own list of transactions in progress would
// not do: it omits those at or above its xmax, which may be running and
// may have drawn ids below L.) Such transactions are tracked, each with a
// bound below every id it can have drawn; once a snapshot shows one
// committed, its rows between its bound and the partitions' highs are read
// by transaction id (its late rows). So nothing committed is skipped, and
// a long transaction holds back nothing but its own rows (and the durable
// cursor, which only costs duplicates after a crash).
type cursor struct {
	// high[p]: every row of partition p with an id at or below it that a
	// past claim's snapshot showed is published or in outbox_failures;
	// above it, nothing was read.
	high map[int32]int64
	// tracked are transactions some claim saw running, by xid8 (text),
	// with a bound below every id they can have drawn.
	tracked map[string]int64
	// ahead are rows a claim read above the id sequence's last value L it
	// read before its snapshot (their transactions committed in between),
	// published or moved to outbox_failures: the highs cannot move past L
	// (a transaction that started after the claim read the running ones
	// may have drawn ids below theirs), so the next claims skip them by id
	// until the highs pass them.
	ahead map[int64]bool
	// lastL is the id sequence's last value read at the previous claim:
	// a transaction running now that was not running then (not tracked)
	// had no transaction id then, so its ids are above lastL. started: a
	// claim ran already.
	lastL   int64
	started bool
	// rebounded is when the tracked transactions were last matched with
	// the ones writing to the outbox (see rebound), at most once every
	// reboundEvery (the constant but in a test).
	rebounded    time.Time
	reboundEvery time.Duration

	// durable is what the lease loop records in outbox_partitions.
	durable atomic.Pointer[durablePoints]
	// published counts rows published since the lease loop last added
	// them to outbox_partitions.published_total.
	published atomic.Int64
}

func newCursor() *cursor {
	return &cursor{high: map[int32]int64{}, tracked: map[string]int64{}, ahead: map[int64]bool{}, reboundEvery: reboundEvery}
}

// highs returns the partitions the cursor follows and their highs, as the
// claim's parameters; a partition it does not follow starts at its
// published_through.
func (c *cursor) highs() ([]int32, []int64) {
	parts := make([]int32, 0, len(c.high))
	highs := make([]int64, 0, len(c.high))
	for p, h := range c.high {
		parts = append(parts, p)
		highs = append(highs, h)
	}
	return parts, highs
}

// aheadArgs returns the rows read ahead, as the claim's parameter.
func (c *cursor) aheadArgs() []int64 {
	out := make([]int64, 0, len(c.ahead))
	for id := range c.ahead {
		out = append(out, id)
	}
	return out
}

// trackedArgs returns the tracked transactions and their bounds, as the
// claim's parameters.
func (c *cursor) trackedArgs() ([]string, []int64) {
	xs := make([]string, 0, len(c.tracked))
	bs := make([]int64, 0, len(c.tracked))
	for x, b := range c.tracked {
		xs = append(xs, x)
		bs = append(bs, b)
	}
	return xs, bs
}

// own makes the cursor follow exactly the partitions owned, starting one
// newly owned at its published_through: rows at or below it were
// published by a previous owner. A transaction tracked with a bound above
// that point may have drawn ids below it in the new partition: its bound
// comes down.
func (c *cursor) own(owned map[int32]int64) {
	for p := range c.high {
		if _, ok := owned[p]; !ok {
			delete(c.high, p)
		}
	}
	for p, through := range owned {
		if _, ok := c.high[p]; ok {
			continue
		}
		c.high[p] = through
		for x, b := range c.tracked {
			if b > through {
				c.tracked[x] = through
			}
		}
	}
}

// snapshot is a pg_snapshot: what it shows committed.
type snapshot struct {
	xmin, xmax uint64
	xip        map[uint64]bool
}

// parseSnapshot reads pg_snapshot's text form, "xmin:xmax:xip,xip,...".
func parseSnapshot(s string) (snapshot, bool) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return snapshot{}, false
	}
	xmin, err1 := strconv.ParseUint(parts[0], 10, 64)
	xmax, err2 := strconv.ParseUint(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		return snapshot{}, false
	}
	sn := snapshot{xmin: xmin, xmax: xmax, xip: map[uint64]bool{}}
	for _, x := range strings.Split(parts[2], ",") {
		if x == "" {
			continue
		}
		v, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			return snapshot{}, false
		}
		sn.xip[v] = true
	}
	return sn, true
}

// shows reports whether the snapshot sees xid committed (for an xid that
// was running before it: committed, not aborted).
func (s snapshot) shows(xid uint64) bool {
	return xid < s.xmin || (xid < s.xmax && !s.xip[xid])
}

// xid8 widens a 32-bit transaction id (pg_locks') to the xid8 nearest the
// snapshot's xmax: a running transaction is within 2^31 of it.
func (s snapshot) xid8(xid uint32) uint64 {
	x := s.xmax&^0xffffffff | uint64(xid)
	switch {
	case x > s.xmax+1<<31 && x >= 1<<32:
		x -= 1 << 32
	case x+1<<31 < s.xmax:
		x += 1 << 32
	}
	return x
}

// advance records what a claim saw and did. l is the sequence's last
// value read before running (the transactions running, 32-bit, as pg_locks
// names them) was read, and both before the claim's snapshot sn; newRows
// is how many rows above the highs the claim returned of limit, lastID the
// highest of them; done are the ids of the new rows that went out or to
// outbox_failures; unsent are, per partition, the lowest id the claim
// returned and did neither publish nor move to outbox_failures (a broker
// outage: read again next time); lateUnsent are the tracked transactions
// with a late row in that case (tracked on, read again).
func (c *cursor) advance(l int64, running []uint32, sn snapshot, newRows, limit int, lastID int64, done []int64, unsent map[int32]int64, lateUnsent map[string]bool) {
	// The partitions' lowest high before this claim: the bound of a
	// transaction running the cursor cannot place better.
	floor := int64(-1)
	for _, h := range c.high {
		if floor < 0 || h < floor {
			floor = h
		}
	}
	to := l
	if newRows >= limit {
		to = min(l, lastID) // rows above lastID were not read
	}
	for _, id := range done {
		if id > to {
			c.ahead[id] = true
		}
	}
	for id := range c.ahead {
		if id <= to {
			delete(c.ahead, id)
		}
	}
	for p, h := range c.high {
		if to > h {
			h = to
		}
		if u, ok := unsent[p]; ok && u-1 < h {
			h = u - 1
		}
		c.high[p] = h
	}
	now := make(map[string]bool, len(running))
	for _, x := range running {
		x8 := sn.xid8(x)
		if !sn.shows(x8) { // committed between the two reads: its rows were read now
			now[strconv.FormatUint(x8, 10)] = true
		}
	}
	// A tracked transaction no longer running is done with: committed, its
	// late rows were read and went out, or aborted.
	for x := range c.tracked {
		if !now[x] && !lateUnsent[x] {
			delete(c.tracked, x)
		}
	}
	// A transaction running that was not at the previous claim had no
	// transaction id then, so it drew its ids after lastL; at the first
	// claim, its ids can be anywhere above the partitions' durable points.
	for x := range now {
		if _, ok := c.tracked[x]; ok {
			continue
		}
		if c.started {
			c.tracked[x] = c.lastL
		} else {
			c.tracked[x] = max(floor, 0)
		}
	}
	c.lastL, c.started = l, true
	c.publishDurable()
}

// durablePoints is what the cursor lets the lease loop record: per
// partition, published_through (the lowest of high and the bounds of the
// transactions tracked) and published_high (high), and the transactions
// tracked with a bound below some high (waiting_xids): every row at or
// below a partition's high was published but theirs.
type durablePoints struct {
	through, high map[int32]int64
	waiting       []string
}

// publishDurable hands the lease loop the points it may record.
func (c *cursor) publishDurable() {
	low, top := int64(-1), int64(-1)
	for _, h := range c.high {
		top = max(top, h)
	}
	d := durablePoints{through: make(map[int32]int64, len(c.high)), high: maps.Clone(c.high)}
	for x, b := range c.tracked {
		if b < top {
			d.waiting = append(d.waiting, x)
		}
		if low < 0 || b < low {
			low = b
		}
	}
	for p, h := range c.high {
		if low >= 0 && low < h {
			h = low
		}
		d.through[p] = h
	}
	c.durable.Store(&d)
}

// durableThrough returns a copy of the durable published_through points.
func (c *cursor) durableThrough() map[int32]int64 {
	if d := c.durable.Load(); d != nil {
		return maps.Clone(d.through)
	}
	return nil
}

// reboundEvery bounds how often a claim asks which transactions write to
// the outbox.
const reboundEvery = 200 * time.Millisecond

// needsRebound reports whether a claim at now should ask which tracked
// transactions write to the outbox: some tracked one holds the durable
// points back (a bound below the highs) and the last asking is old
// enough.
func (c *cursor) needsRebound(now time.Time) bool {
	if now.Sub(c.rebounded) < c.reboundEvery {
		return false
	}
	low := int64(-1)
	for _, h := range c.high {
		if low < 0 || h < low {
			low = h
		}
	}
	for _, b := range c.tracked {
		if b < low {
			return true
		}
	}
	return false
}

// needsReboundIdle is needsRebound for an idle forwarder, at most once
// every interval.
func (c *cursor) needsReboundIdle(now time.Time, interval time.Duration) bool {
	return now.Sub(c.rebounded) >= interval && c.needsRebound(now)
}

// rebound raises to l, the id sequence's last value read before writers
// was, the bound of every tracked transaction that writers lists as
// running without a lock on the outbox: it had written no outbox row yet,
// so every row it writes later has an id above l. Transactions of other
// tables, other schemas or other databases in the cluster (every snapshot
// lists them) then hold nothing back, however long they run. writers is
// read before the claim's snapshot (see outboxWritersSQL): a writer that
// was committing then, its table locks already released, shows committed
// in the snapshot sn, and the claim read its rows from the bound it had:
// its bound stays, for advance to settle once the batch is done (raised
// now, the durable points would pass its rows while they are still being
// published, and a broker outage that leaves them unsent would leave them
// below the bound the next claims read from). A tracked transaction
// writers does not list had ended: its bound stays too.
func (c *cursor) rebound(l int64, writers map[string]bool, sn snapshot, now time.Time) {
	for x, b := range c.tracked {
		if b >= l {
			continue
		}
		// pg_locks names a transaction by its 32-bit xid, the low half of
		// its xid8.
		x8, err := strconv.ParseUint(x, 10, 64)
		if err != nil || sn.shows(x8) {
			continue
		}
		if w, running := writers[strconv.FormatUint(x8&0xffffffff, 10)]; running && !w {
			c.tracked[x] = l
		}
	}
	c.rebounded = now
	c.publishDurable()
}
