package console

// WebhookQueries are the /webhooks list's queries, by filter and kind
// (a page after, a page before, the count, the rank), for the test of
// their plans.
var WebhookQueries = func() map[string]string {
	qs := map[string]string{}
	for name, sts := range map[string][]string{"failing and dead": webhookStatuses, "failing": {"failing"}, "dead": {"dead"}} {
		qs[name+", after"] = webhookListQuery(sts, false)
		qs[name+", before"] = webhookListQuery(sts, true)
		qs[name+", count"] = webhookCountQuery(sts, false)
		qs[name+", rank"] = webhookCountQuery(sts, true)
	}
	return qs
}()

// HistoryLen is how many samples c's history holds.
func HistoryLen(c *Console) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.health.history)
}
