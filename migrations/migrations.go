package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"regexp"

	"github.com/pressly/goose/v3"
)

//go:embed sql/*.sql
var embedded embed.FS

// VersionTable records which of the framework's migrations are applied.
const VersionTable = "outflow_migrations"

// LegacyVersionTable is the version table of the releases whose single set
// of migrations held both the framework's tables and the reference app's.
// The framework set and the app set adopt their versions from it (see
// [Set.AdoptFrom]) and leave it in place.
const LegacyVersionTable = "outflow_schema_migrations"

// ErrNoSchema is returned when Config.Schema is empty and the connection's
// search_path names no existing schema, so there is nowhere to migrate.
var ErrNoSchema = errors.New("migrations: no schema to migrate: set Config.Schema, or a search_path whose first schema exists")

// ErrNotVersionTable is returned when a set's VersionTable names an
// existing table that is not a goose version table: nothing runs, rather
// than reading that table's rows as the set's applied versions.
var ErrNotVersionTable = errors.New("migrations: the set's version table exists and is not a goose version table")

// FS returns the framework's embedded migration files.
func FS() fs.FS {
	sub, err := fs.Sub(embedded, "sql")
	if err != nil {
		panic(err) // the embed pattern guarantees the directory
	}
	return sub
}

// Set is one versioned set of SQL migrations (goose files named
// NNNNN_name.sql) with a version table of its own, so that sets owned by
// different code (the framework's, a service's) are applied, rolled back
// and listed independently in the same schema.
type Set struct {
	// Name identifies the set in errors and logs. Required.
	Name string
	// FS holds the set's files at its root. Required.
	FS fs.FS
	// VersionTable records the set's applied versions: a lower-case SQL
	// identifier, unqualified (it lives in the migrated schema), distinct
	// for each set and from any set's AdoptFrom. Required. Created on the
	// set's first run; an existing table of that name that is not a goose
	// version table is refused ([ErrNotVersionTable]).
	VersionTable string
	// AdoptFrom, if set, names a version table of an earlier release that
	// applied some of this set's versions. When the set's own table does
	// not exist yet and AdoptFrom does, the set's first run creates its
	// table with the rows of its own versions copied from AdoptFrom (their
	// original timestamps included), so those migrations are not run again.
	// AdoptFrom itself is left unchanged.
	AdoptFrom string
}

// Framework returns Outflow's own set: the outbox, the forwarder's state,
// the consumers' bookkeeping (processed messages, aggregate versions, dead
// letters). It adopts from [LegacyVersionTable].
func Framework() Set {
	return Set{Name: "outflow", FS: FS(), VersionTable: VersionTable, AdoptFrom: LegacyVersionTable}
}

var identifier = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

func (s Set) validate() error {
	switch {
	case s.Name == "":
		return errors.New("migrations: Set.Name is required")
	case s.FS == nil:
		return fmt.Errorf("migrations: set %s: FS is required", s.Name)
	case !identifier.MatchString(s.VersionTable):
		return fmt.Errorf("migrations: set %s: VersionTable %q must be a lower-case unqualified SQL identifier", s.Name, s.VersionTable)
	case s.AdoptFrom != "" && !identifier.MatchString(s.AdoptFrom):
		return fmt.Errorf("migrations: set %s: AdoptFrom %q must be a lower-case unqualified SQL identifier", s.Name, s.AdoptFrom)
	case s.AdoptFrom == s.VersionTable:
		return fmt.Errorf("migrations: set %s: AdoptFrom must differ from VersionTable", s.Name)
	}
	return nil
}

// Config configures a [Migrator]. The zero value migrates the first schema
// of the connection's search_path, as the single-set releases did.
type Config struct {
	// Schema is the schema the set's objects and version table go into,
	// created if missing (the role needs CREATE on the database for that):
	// a lower-case SQL identifier.
	// The migrations run with search_path set to this schema alone, and the
	// connection's own search_path is restored afterwards. Empty, the
	// default, means the connection's current_schema().
	//
	// The runtime components (events/outbox, forwarder, idempotency, the
	// outflow command) qualify no table name: they find the tables through
	// the search_path of their connections, so point it at this schema, e.g.
	// with ?search_path=outflow in the database URL.
	Schema string
	// Logger receives goose's progress and adoption messages. Nil, the
	// default, leaves goose's own logger (standard output).
	Logger *slog.Logger
}

func (c Config) validate() error {
	if c.Schema != "" && !identifier.MatchString(c.Schema) {
		return fmt.Errorf("migrations: Schema %q must be a lower-case SQL identifier of at most 63 bytes", c.Schema)
	}
	return nil
}

// Migrator applies, rolls back and lists one [Set] in one schema.
// Concurrent Migrators of the same schema, in one process or several,
// serialize on a PostgreSQL advisory lock keyed by the schema's name.
type Migrator struct {
	db  *sql.DB
	set Set
	cfg Config
}

// New returns a Migrator of the framework's set.
func New(db *sql.DB, cfg Config) (*Migrator, error) {
	return NewMigrator(db, Framework(), cfg)
}

// NewMigrator returns a Migrator of set. It does not touch the database.
func NewMigrator(db *sql.DB, set Set, cfg Config) (*Migrator, error) {
	if db == nil {
		return nil, errors.New("migrations: db is required")
	}
	if err := set.validate(); err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Migrator{db: db, set: set, cfg: cfg}, nil
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

// provider returns a goose provider of the set, after preparing the schema
// for it (see prepare).
func (m *Migrator) provider(ctx context.Context) (*goose.Provider, error) {
	table := m.set.VersionTable
	if m.cfg.Schema != "" {
		// Qualified: goose also reads the table on connections other than
		// the locked one, whose search_path is the caller's.
		table = m.cfg.Schema + "." + table
	}
	opts := []goose.ProviderOption{
		goose.WithTableName(table),
		goose.WithSessionLocker(&session{schema: m.cfg.Schema}),
		goose.WithDisableGlobalRegistry(true),
	}
	if m.cfg.Logger != nil {
		opts = append(opts, goose.WithSlog(m.cfg.Logger))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, m.db, m.set.FS, opts...)
	if err != nil {
		return nil, fmt.Errorf("migrations: set %s: %w", m.set.Name, err)
	}
	var versions []int64
	for _, s := range p.ListSources() {
		versions = append(versions, s.Version)
	}
	if err := m.prepare(ctx, versions); err != nil {
		return nil, fmt.Errorf("migrations: set %s: %w", m.set.Name, err)
	}
	return p, nil
}

// Up applies every pending migration of the set and returns those it ran.
func (m *Migrator) Up(ctx context.Context) ([]Result, error) {
	p, err := m.provider(ctx)
	if err != nil {
		return nil, err
	}
	rs, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate %s up: %w", m.set.Name, err)
	}
	return results(rs), nil
}

// Down rolls back the set's most recent migration. It returns nil, nil
// when there is nothing to roll back.
func (m *Migrator) Down(ctx context.Context) (*Result, error) {
	p, err := m.provider(ctx)
	if err != nil {
		return nil, err
	}
	r, err := p.Down(ctx)
	if err != nil {
		if isNoNextVersion(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("migrate %s down: %w", m.set.Name, err)
	}
	if r == nil {
		return nil, nil
	}
	out := results([]*goose.MigrationResult{r})
	return &out[0], nil
}

// Status lists every migration of the set and whether it is applied.
func (m *Migrator) Status(ctx context.Context) ([]Status, error) {
	p, err := m.provider(ctx)
	if err != nil {
		return nil, err
	}
	ss, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration status of %s: %w", m.set.Name, err)
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

// Up applies every pending framework migration in the connection's
// current schema: New(db, Config{}) then Up.
func Up(ctx context.Context, db *sql.DB) ([]Result, error) {
	m, err := New(db, Config{})
	if err != nil {
		return nil, err
	}
	return m.Up(ctx)
}

// Down rolls back the most recent framework migration in the connection's
// current schema. It returns nil, nil when there is nothing to roll back.
func Down(ctx context.Context, db *sql.DB) (*Result, error) {
	m, err := New(db, Config{})
	if err != nil {
		return nil, err
	}
	return m.Down(ctx)
}

// CurrentStatus lists every framework migration of the connection's
// current schema and whether it is applied.
func CurrentStatus(ctx context.Context, db *sql.DB) ([]Status, error) {
	m, err := New(db, Config{})
	if err != nil {
		return nil, err
	}
	return m.Status(ctx)
}

func results(rs []*goose.MigrationResult) []Result {
	out := make([]Result, 0, len(rs))
	for _, r := range rs {
		out = append(out, Result{Version: r.Source.Version, Name: baseName(r.Source.Path), Up: r.Direction == "up"})
	}
	return out
}
