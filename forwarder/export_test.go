package forwarder

import "time"

// LowWaterMark is the claim's current low-water mark, for tests that must
// know the mark passed a row.
func (f *Forwarder) LowWaterMark() int64 { return f.low.seen.Load() }

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
