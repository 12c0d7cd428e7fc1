package appmigrations

import (
	"context"
	"database/sql"
	"embed"
	"io/fs"

	"github.com/outflow-dev/outflow/migrations"
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

// New returns a Migrator of the app's set.
func New(db *sql.DB, cfg migrations.Config) (*migrations.Migrator, error) {
	return migrations.NewMigrator(db, Set(), cfg)
}

// Up applies every pending migration of the app's set in the connection's
// current schema. Run the framework's set ([migrations.Up]) first.
func Up(ctx context.Context, db *sql.DB) ([]migrations.Result, error) {
	m, err := New(db, migrations.Config{})
	if err != nil {
		return nil, err
	}
	return m.Up(ctx)
}

// Down rolls back the app set's most recent migration in the connection's
// current schema; nil, nil when there is nothing to roll back.
func Down(ctx context.Context, db *sql.DB) (*migrations.Result, error) {
	m, err := New(db, migrations.Config{})
	if err != nil {
		return nil, err
	}
	return m.Down(ctx)
}
