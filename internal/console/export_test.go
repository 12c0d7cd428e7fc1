package console

import (
	"net/http"

	"github.com/outflow-dev/outflow/webhooks/deliveries"
)

// Routes are the console's route patterns ("GET /journey").
func Routes(c *Console) []string {
	var out []string
	for _, rt := range c.routes(http.NotFoundHandler()) {
		out = append(out, rt.pattern)
	}
	return out
}

// Queries are the console's queries on the big tables, by name, for the
// test that checks each uses an index.
var Queries = map[string]string{
	"find message": qFindMessage, "events after": qEventsAfter, "events before": qEventsBefore, "processed": qProcessed, "dead outcomes": qDeadOutcomes,
	"deliveries": qDeliveries, "parked": qParked, "webhook stats": deliveries.StatsQuery,
	// The /dead list, for each filter: every open status or one, every
	// consumer or one.
	"dead letters":                     deadLettersQuery(false, openStatuses),
	"dead letters of a consumer":       deadLettersQuery(true, openStatuses),
	"dead letters of a status":         deadLettersQuery(false, []string{"dead"}),
	"dead letters of consumer, status": deadLettersQuery(true, []string{"held"}),
	// The counts, errors and bounds around a page of /dead.
	"count of dead letters":               deadCountQuery(false, false, openStatuses, ""),
	"count of dead letters of a consumer": deadCountQuery(true, false, openStatuses, "id < @first"),
	"count of dead letters of an error":   deadStatusCountsQuery(true, true, openStatuses),
	"page of dead letters before":         deadPageQuery(true, true, openStatuses, true),
	"errors of dead letters":              deadErrorsQuery(true, openStatuses),
	"newest dead letter":                  deadMaxQuery(true, true),
	"consumers of dead letters":           knownConsumersQuery,
}

// CountCap is where a list stops counting.
const CountCap = countCap
