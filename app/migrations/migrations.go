package appmigrations

import (
	"context"
	"database/sql"
	"embed"
	"io/fs"

	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/webhooks/schema"
)

//go:embed sql/*.sql
var embedded embed.FS

// VersionTable records which of the reference app's migrations are applied.
const VersionTable = "app_schema_migrations"

// Set returns the reference app's migrations. It adopts the versions the
// single-set releases recorded in [migrations.LegacyVersionTable].
func Set() migrations.Set {
	sub, err := fs.Sub(embedded, "sql")
	if err != nil {
		panic(err) // the embed pattern guarantees the directory
	}
	return migrations.Set{
		Name:         "app",
		FS:           sub,
		VersionTable: VersionTable,
		AdoptFrom:    migrations.LegacyVersionTable,
	}
}

// Sets returns the sets the reference app needs after the framework's, in
// the order to apply them: the webhook package's (webhooks/schema), on
// whose webhook_endpoints the app's 00034 builds, then the app's own.
func Sets() []migrations.Set {
	return []migrations.Set{schema.Set(), Set()}
}

// New returns a Migrator of the app's set.
func New(db *sql.DB, cfg migrations.Config) (*migrations.Migrator, error) {
	return migrations.NewMigrator(db, Set(), cfg)
}

// Up applies every pending migration of [Sets] (the webhook package's set,
// then the app's) in the connection's current schema. Run the framework's
// set ([migrations.Up]) first.
func Up(ctx context.Context, db *sql.DB) ([]migrations.Applied, error) {
	return migrations.UpSets(ctx, db, migrations.Config{}, Sets()...)
}

// Down rolls back the app set's most recent migration (never the webhook
// package's: roll that back on its own, after the app's 00034) in the connection's
// current schema; nil, nil when there is nothing to roll back.
func Down(ctx context.Context, db *sql.DB) (*migrations.Result, error) {
	m, err := New(db, migrations.Config{})
	if err != nil {
		return nil, err
	}
	return m.Down(ctx)
}
