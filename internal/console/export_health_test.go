package console

// WebhookQueries are the /webhooks list's queries, by filter and kind
// (a page after, a page before, the count, the rank), for the test of
// their plans.
var WebhookQueries = func() map[string]string {
	qs := map[string]string{}
	for name, sts := range map[string][]string{"failing and failed": webhookStatuses, "failing": {"failing"}, "failed": {"failed"}} {
		for _, account := range []bool{false, true} {
			if account {
				name += " of an account"
			}
			qs[name+", after"] = webhookListQuery(sts, false, account)
			qs[name+", before"] = webhookListQuery(sts, true, account)
			qs[name+", count"] = webhookCountQuery(sts, false, account)
			qs[name+", rank"] = webhookCountQuery(sts, true, account)
		}
	}
	return qs
}()

// HistoryLen is how many samples c's history holds.
func HistoryLen(c *Console) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.health.history)
}
