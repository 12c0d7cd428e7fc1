package schema_test

import (
	"context"
	"testing"

	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks/schema"
)

// The set applies after the framework's, and rolls back to nothing.
func TestSetUpAndDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t, schema.Set())
	tables := func() int {
		var n int
		if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables
			WHERE schemaname = current_schema() AND tablename LIKE 'webhook\_%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := tables(); got != 4 {
		t.Fatalf("%d webhook tables after up, want 4", got)
	}
	m, err := migrations.NewMigrator(s.OpenDB(t), schema.Set(), migrations.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		r, err := m.Down(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if r == nil {
			break
		}
	}
	if got := tables(); got != 0 {
		t.Fatalf("%d webhook tables after down, want 0", got)
	}
}
