package payouts

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"

	"github.com/pressly/goose/v3"
)

//go:embed sql/*.sql
var migrationFiles embed.FS

// MigrationTable records which of the service's migrations ran. It is not
// the framework's: each set keeps its own versions.
const MigrationTable = "payouts_schema_migrations"

// Migrate applies the service's own migrations. Run the framework's
// (package migrations) first: nothing here depends on them, but the service
// cannot write an event without the outbox.
func Migrate(ctx context.Context, db *sql.DB) error {
	files, err := fs.Sub(migrationFiles, "sql")
	if err != nil {
		return err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files,
		goose.WithTableName(MigrationTable), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("payouts migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("payouts migrations: %w", err)
	}
	return nil
}
