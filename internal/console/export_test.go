package console

// Queries are the console's queries on the big tables, by name, for the
// test that checks each uses an index.
var Queries = map[string]string{
	"find message": qFindMessage, "events": qEvents, "processed": qProcessed, "dead outcomes": qDeadOutcomes,
	"deliveries": qDeliveries, "parked": qParked, "dead letters": qDeadLetters, "webhook stats": qWebhookStats,
}
