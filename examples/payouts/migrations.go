package payouts

import (
	"context"
	"database/sql"
	"embed"
	"io/fs"

	"github.com/outflow-dev/outflow/migrations"
	"github.com/outflow-dev/outflow/webhooks/schema"
)

//go:embed sql/*.sql
var migrationFiles embed.FS

// Migrations is the service's own migration set, with a version table of
// its own beside the framework's: the framework's set (migrations.Framework)
// runs first, then this one.
func Migrations() migrations.Set {
	files, err := fs.Sub(migrationFiles, "sql")
	if err != nil {
		panic(err) // the embed pattern guarantees the directory
	}
	return migrations.Set{Name: "payouts", FS: files, VersionTable: "payouts_schema_migrations"}
}

// Migrate applies the framework's migrations, the webhook tables' and then
// the service's, in the schema db's connections use, in one call
// (migrations.UpSetsPool does the same from a pgx pool).
func Migrate(ctx context.Context, db *sql.DB) error {
	_, err := migrations.UpSets(ctx, db, migrations.Config{}, migrations.Framework(), schema.Set(), Migrations())
	return err
}
