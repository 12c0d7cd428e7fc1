package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/pressly/goose/v3"
)

//go:embed sql/*.sql
var embedded embed.FS

// VersionTable records which migrations have been applied.
const VersionTable = "outflow_schema_migrations"

// FS returns the embedded migration files.
func FS() fs.FS {
	sub, err := fs.Sub(embedded, "sql")
	if err != nil {
		panic(err) // the embed pattern guarantees the directory
	}
	return sub
}

// Status is one migration and whether it is applied.
type Status struct {
	Version int64
	Name    string
	Applied bool
}

// Result is one migration that ran.
type Result struct {
	Version int64
	Name    string
	Up      bool
}

func newProvider(db *sql.DB, logger *slog.Logger) (*goose.Provider, error) {
	opts := []goose.ProviderOption{
		goose.WithTableName(VersionTable),
		goose.WithSessionLocker(schemaLocker{}),
		goose.WithDisableGlobalRegistry(true),
	}
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, FS(), opts...)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}

// Up applies every pending migration and returns those it ran.
func Up(ctx context.Context, db *sql.DB) ([]Result, error) {
	p, err := newProvider(db, nil)
	if err != nil {
		return nil, err
	}
	rs, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate up: %w", err)
	}
	return results(rs), nil
}

// Down rolls back the most recent migration. It returns nil, nil when there
// is nothing to roll back.
func Down(ctx context.Context, db *sql.DB) (*Result, error) {
	p, err := newProvider(db, nil)
	if err != nil {
		return nil, err
	}
	r, err := p.Down(ctx)
	if err != nil {
		if isNoNextVersion(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("migrate down: %w", err)
	}
	out := results([]*goose.MigrationResult{r})
	return &out[0], nil
}

// CurrentStatus lists every known migration and whether it is applied.
func CurrentStatus(ctx context.Context, db *sql.DB) ([]Status, error) {
	p, err := newProvider(db, nil)
	if err != nil {
		return nil, err
	}
	ss, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration status: %w", err)
	}
	out := make([]Status, 0, len(ss))
	for _, s := range ss {
		out = append(out, Status{
			Version: s.Source.Version,
			Name:    baseName(s.Source.Path),
			Applied: s.State == goose.StateApplied,
		})
	}
	return out, nil
}

func results(rs []*goose.MigrationResult) []Result {
	out := make([]Result, 0, len(rs))
	for _, r := range rs {
		out = append(out, Result{Version: r.Source.Version, Name: baseName(r.Source.Path), Up: r.Direction == "up"})
	}
	return out
}
