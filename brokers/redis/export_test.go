package redis

// SetAuditHook makes b's Checks call f after they read the groups' floors
// and before they look for the held entries: a test's way to act in the
// middle of one.
func SetAuditHook(b *Broker, f func()) { b.auditHook = f }
