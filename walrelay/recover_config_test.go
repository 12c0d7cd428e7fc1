package walrelay_test

import (
	"context"
	"strings"
	"testing"

	"github.com/outflow-dev/outflow/walrelay"
)

// RecoverSlot names every wrong field before it touches the database.
func TestRecoverSlotValidatesItsConfig(t *testing.T) {
	t.Parallel()
	_, err := walrelay.RecoverSlot(context.Background(), nil, walrelay.RecoverConfig{SlotName: "Bad-Name", Publication: "1x"})
	if err == nil || !strings.Contains(err.Error(), "recover slot config: SlotName: ") || !strings.Contains(err.Error(), "\nPublication: ") {
		t.Fatalf("RecoverSlot = %v, want SlotName's and Publication's errors", err)
	}
}
