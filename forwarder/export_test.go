package forwarder

// LowWaterMark is the claim's current low-water mark, for tests that must
// know the mark passed a row.
func (f *Forwarder) LowWaterMark() int64 { return f.low.seen.Load() }
