package sender

// SetSettleHook makes s call f before settling each result (tests only).
func SetSettleHook(s *Sender, f func(deliveryID int64)) { s.settleHook = f }

// LeaseSQL is the lease statement, for the test that reads its plan.
const LeaseSQL = leaseSQL
