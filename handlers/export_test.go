package handlers

// SetSettleHook makes s call f before it settles an attempt: a test holds a
// result back to play a sender that lost its lease.
func SetSettleHook(s *Sender, f func(deliveryID int64)) { s.settleHook = f }
