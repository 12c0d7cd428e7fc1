package paymentevents_test

import (
	"testing"

	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/schemacheck"
	"github.com/outflow-dev/outflow/outflowtest"
)

// The payment events still read every payment event stored (the outbox's
// history, the broker's retention, replays), and consumers on the previous
// build read what this one writes: the payments service and its consumers
// deploy independently. A change that breaks either fails here naming the
// event type, the field and the rule; see docs/events.md, "Checking
// compatibility". `outflow events check` runs the same check.
func TestPaymentEventSchemasAreCompatible(t *testing.T) {
	reg := events.NewRegistry()
	if err := paymentevents.Register(reg); err != nil {
		t.Fatal(err)
	}
	outflowtest.RequireCompatibleEvents(t, reg, paymentevents.SchemaSnapshot, outflowtest.WithCompatMode(schemacheck.Full))
}
