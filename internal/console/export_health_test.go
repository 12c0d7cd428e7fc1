package console

// WebhookQueries are the /webhooks list's queries, by filter, for the test
// of their plans.
var WebhookQueries = map[string]string{
	"failing and dead": webhookListQuery(webhookStatuses),
	"failing":          webhookListQuery([]string{"failing"}),
	"dead":             webhookListQuery([]string{"dead"}),
}

// HistoryLen is how many samples c's history holds.
func HistoryLen(c *Console) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.health.history)
}
