package forwarder

import "time"

// PublishedThrough is what the forwarder may record of partition p's
// cursor now (-1 when it does not hold p), for tests that must know the
// cursor passed a row.
func (f *Forwarder) PublishedThrough(p int32) int64 {
	if t, ok := f.cur.durableThrough()[p]; ok {
		return t
	}
	return -1
}

// SetAuditLimits sets how many receipt rows (each end) and receipts one
// audit reads at most; it returns a function that puts them back.
func SetAuditLimits(rows, held int) func() {
	oldRows, oldHeld := auditRowLimit, auditHeldLimit
	auditRowLimit, auditHeldLimit = rows, held
	return func() { auditRowLimit, auditHeldLimit = oldRows, oldHeld }
}

// SetAuditCallTimeout sets how long one Auditor.Check call may take, for
// the test of a broker topic that does not answer; it returns the previous.
func SetAuditCallTimeout(d time.Duration) time.Duration {
	old := auditCallTimeout
	auditCallTimeout = d
	return old
}

// ClaimStatements are the claim statement for batches of n rows and the
// statements run before and after it, for the tests of its plan.
func ClaimStatements(n int) (before, claim, after string) {
	return claimPlanBefore, claimQuery(n), claimPlanAfter
}

// SetReboundEvery sets how often f's claims ask which transactions write
// to the outbox. Call it before Run.
func (f *Forwarder) SetReboundEvery(d time.Duration) { f.cur.reboundEvery = d }

// TakeoverSQL is the lease tick's takeover statement: instance $1, lease
// seconds $2, up to $3 partitions of the set from $4, $5 of them.
func TakeoverSQL() string { return takeoverSQL }

// SetMaxPendingReceipts sets how many receipts may wait for a lease tick;
// it returns a function that puts the bound back.
func SetMaxPendingReceipts(n int) func() {
	old := maxPendingReceipts
	maxPendingReceipts = n
	return func() { maxPendingReceipts = old }
}
