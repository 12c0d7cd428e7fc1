package payouts

import (
	"context"
	"database/sql"
	"embed"
	"io/fs"

	"github.com/outflow-dev/outflow/migrations"
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

// Migrate applies the framework's migrations, then the service's, in the
// schema db's connections use.
func Migrate(ctx context.Context, db *sql.DB) error {
	for _, set := range []migrations.Set{migrations.Framework(), Migrations()} {
		m, err := migrations.NewMigrator(db, set, migrations.Config{})
		if err != nil {
			return err
		}
		if _, err := m.Up(ctx); err != nil {
			return err
		}
	}
	return nil
}
