package payouts_test

import (
	"testing"

	"github.com/outflow-dev/outflow/outflowtest"
)

func TestEventSchemasAreCompatible(t *testing.T) {
	outflowtest.RequireCompatibleEvents(t, registry(t), "event-schemas.json")
}
