package redis

// SetAuditHook makes b's audits call f between their two looks at a
// stream: a test's way to act in the middle of one.
func SetAuditHook(b *Broker, f func()) { b.auditHook = f }
