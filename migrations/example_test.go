package migrations_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// The framework's tables in a schema of their own, created by the first
// run. The service's connections then name the schema in their
// search_path (e.g. ?search_path=outflow in the URL).
func ExampleNew() {
	ctx := context.Background()
	db, err := sql.Open("pgx", outflowtest.DatabaseURL())
	if err != nil {
		panic(err)
	}
	defer db.Close()
	schema := fmt.Sprintf("outflow_example_%d", os.Getpid())      // "outflow" in a service
	defer db.Exec(`DROP SCHEMA IF EXISTS ` + schema + ` CASCADE`) //nolint:errcheck // leave the test database clean

	m, err := migrations.New(db, migrations.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	applied, err := m.Up(ctx)
	if err != nil {
		panic(err)
	}
	again, err := m.Up(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("applied:", len(applied), "then:", len(again))
	for _, r := range applied[:2] {
		fmt.Println(r.Version, r.Name)
	}
	// Output:
	// applied: 19 then: 0
	// 1 00001_outbox.sql
	// 4 00004_forwarder.sql
}
