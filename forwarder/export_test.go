package forwarder

import "time"

// LowWaterMark is the claim's current low-water mark, for tests that must
// know the mark passed a row.
func (f *Forwarder) LowWaterMark() int64 { return f.low.seen.Load() }

// SetAuditCallTimeout sets how long one Auditor.Audit call may take, for
// the test of a broker topic that does not answer; it returns the previous.
func SetAuditCallTimeout(d time.Duration) time.Duration {
	old := auditCallTimeout
	auditCallTimeout = d
	return old
}
