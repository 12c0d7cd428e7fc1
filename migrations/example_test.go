package migrations_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
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
	// applied: 21 then: 0
	// 1 00001_outbox.sql
	// 4 00004_forwarder.sql
}

// A service's own set beside the framework's, both applied by one call from
// the service's pgx pool: the framework's first, then the service's, each
// recorded in its own version table.
func ExampleUpSetsPool() {
	ctx := context.Background()
	schema := fmt.Sprintf("refunds_example_%d", os.Getpid())
	pool, err := pgxpool.New(ctx, outflowtest.DatabaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	defer pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) //nolint:errcheck // leave the test database clean

	refunds := migrations.Set{
		Name:         "refunds",
		FS:           os.DirFS("testdata/refunds"), // in a service: an embed.FS of its migrations
		VersionTable: "refunds_schema_migrations",
	}
	applied, err := migrations.UpSetsPool(ctx, pool, migrations.Config{Schema: schema}, migrations.Framework(), refunds)
	if err != nil {
		panic(err)
	}
	perSet := map[string]int{}
	for _, a := range applied {
		perSet[a.Set]++
	}
	last := applied[len(applied)-1]
	fmt.Println("outflow:", perSet["outflow"], "refunds:", perSet["refunds"])
	fmt.Println("last:", last.Set, last.Name)
	// Output:
	// outflow: 21 refunds: 2
	// last: refunds 00002_refund_reason.sql
}
