package cli

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/spf13/cobra"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/migrations"
	webhookschema "github.com/outflow-dev/outflow/webhooks/schema"
)

// The built-in sets `--set` names. The app's is never applied unless
// named: the tool serves any service's database, and the reference app's
// tables (merchants, payments, the ledger, ...) belong to that app alone.
// The webhook package's (webhooks/schema) is applied when named, and
// before the app's whenever that is: the app's merchants' webhooks are
// its endpoints.
const (
	setFramework = "outflow"
	setWebhooks  = "webhooks"
	setApp       = "app"
)

// builtIn says whether name is a built-in set's.
func builtIn(name string) bool {
	return name == setFramework || name == setWebhooks || name == setApp
}

// setName is the name a directory set may take: its default version
// table, NAME_schema_migrations, is then a valid identifier.
var setName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,40}$`)

// versionTable is what package migrations accepts for Set.VersionTable.
var versionTable = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// reservedVersionTables are the version tables no directory set may use:
// goose would read the versions of another set (up skipping the user's
// migrations, down running the user's SQL and deleting the other set's
// row).
var reservedVersionTables = map[string]string{
	migrations.VersionTable:       "the framework's set's version table",
	migrations.LegacyVersionTable: "the version table of the single-set releases, which the framework's and the app's sets adopt from",
	appmigrations.VersionTable:    "the reference app's set's version table",
	webhookschema.VersionTable:    "the webhook package's set's version table",
}

// setFlags are the sets `outflow migrate` works on: --set (repeatable) and
// the version tables of the directory sets.
type setFlags struct {
	sets          []string
	versionTables []string
}

func (f *setFlags) register(cmd *cobra.Command) {
	cmd.PersistentFlags().StringArrayVar(&f.sets, "set", nil,
		`a migration set, repeatable: "outflow" (the framework's, always applied first by up and listed by status), `+
			`"webhooks" (the webhook package's endpoints and deliveries, applied before "app" whenever that is named), `+
			`"app" (the reference payments app's: never applied unless named), or NAME=DIR, a directory of goose files `+
			`(NNNNN_name.sql) recorded in NAME_schema_migrations`)
	cmd.PersistentFlags().StringArrayVar(&f.versionTables, "version-table", nil,
		"NAME=TABLE: the version table of the directory set NAME (default NAME_schema_migrations), repeatable: "+
			"a goose version table of that set alone, or a table that does not exist yet (never "+
			migrations.VersionTable+", "+migrations.LegacyVersionTable+", "+webhookschema.VersionTable+" or "+appmigrations.VersionTable+")")
}

// resolve returns the sets named, in the order named, each checked:
// nothing touches the database before every flag is valid.
func (f *setFlags) resolve() ([]migrations.Set, error) {
	tables := map[string]string{}
	for _, v := range f.versionTables {
		name, table, ok := strings.Cut(v, "=")
		if !ok || name == "" || table == "" {
			return nil, fmt.Errorf("invalid --version-table %q: want NAME=TABLE, e.g. refunds=refunds_schema_migrations", v)
		}
		if !versionTable.MatchString(table) {
			return nil, fmt.Errorf("invalid --version-table %q: TABLE must be a lower-case unqualified SQL identifier", v)
		}
		if reserved, ok := reservedVersionTables[table]; ok {
			return nil, fmt.Errorf("invalid --version-table %q: %s is %s: a directory set needs a version table of its own", v, table, reserved)
		}
		if _, dup := tables[name]; dup {
			return nil, fmt.Errorf("invalid --version-table %q: set %s given a version table twice", v, name)
		}
		tables[name] = table
	}
	var sets []migrations.Set
	seen := map[string]bool{}
	for _, v := range f.sets {
		var set migrations.Set
		name, dir, isDir := strings.Cut(v, "=")
		switch {
		case !isDir && name == setFramework:
			set = migrations.Framework()
		case !isDir && name == setWebhooks:
			set = webhookschema.Set()
		case !isDir && name == setApp:
			set = appmigrations.Set()
		case !isDir:
			return nil, fmt.Errorf("invalid --set %q: want %q, %q, %q or NAME=DIR (a directory of goose NNNNN_name.sql files)",
				v, setFramework, setWebhooks, setApp)
		case builtIn(name):
			return nil, fmt.Errorf("invalid --set %q: %s is a built-in set: name it alone (--set %s)", v, name, name)
		case !setName.MatchString(name):
			return nil, fmt.Errorf("invalid --set %q: NAME must be lower-case letters, digits and _, starting with a letter", v)
		default:
			var err error
			if set, err = dirSet(name, dir); err != nil {
				return nil, fmt.Errorf("invalid --set %q: %w", v, err)
			}
		}
		if seen[set.Name] {
			return nil, fmt.Errorf("invalid --set %q: set %s given twice", v, set.Name)
		}
		seen[set.Name] = true
		if table, ok := tables[set.Name]; ok {
			if builtIn(set.Name) {
				return nil, fmt.Errorf("invalid --version-table %s=%s: the built-in set %s keeps its own", set.Name, table, set.Name)
			}
			set.VersionTable = table
		}
		sets = append(sets, set)
	}
	for name, table := range tables {
		if !seen[name] {
			return nil, fmt.Errorf("invalid --version-table %s=%s: no --set %s=DIR", name, table, name)
		}
	}
	return sets, nil
}

// flagOf names the flag that chose set's version table, for an error
// about it: --version-table NAME=TABLE, or --set for the default one.
func (f *setFlags) flagOf(set migrations.Set) string {
	for _, v := range f.versionTables {
		if name, _, _ := strings.Cut(v, "="); name == set.Name {
			return "--version-table " + v
		}
	}
	return fmt.Sprintf("--set %s (its version table %s)", set.Name, set.VersionTable)
}

// checkVersionTables refuses, before anything runs, a directory set whose
// version table exists and is not a goose version table (one of the
// service's own tables, say): goose would take its rows for versions.
// Package migrations refuses it too (migrations.ErrNotVersionTable), when
// a table of that name appears while the sets before it run.
func (f *setFlags) checkVersionTables(ctx context.Context, db *sql.DB, sets []migrations.Set) error {
	for _, set := range sets {
		if builtIn(set.Name) {
			continue
		}
		var exists, goose bool
		if err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL,
			(SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass($1) AND NOT attisdropped AND attnum > 0
			   AND attname IN ('id', 'version_id', 'is_applied', 'tstamp')) = 4`, set.VersionTable).Scan(&exists, &goose); err != nil {
			return fmt.Errorf("look for version table %s: %w", set.VersionTable, err)
		}
		if exists && !goose {
			return fmt.Errorf("invalid %s: table %s exists and is not a goose version table (no id, version_id, is_applied and tstamp columns): "+
				"name a table of the set's own", f.flagOf(set), set.VersionTable)
		}
	}
	return nil
}

// flagError names the flag of the set whose version table package
// migrations refused.
func (f *setFlags) flagError(err error, sets []migrations.Set) error {
	if !errors.Is(err, migrations.ErrNotVersionTable) {
		return err
	}
	for _, set := range sets {
		if strings.Contains(err.Error(), "set "+set.Name+":") {
			return fmt.Errorf("invalid %s: %w", f.flagOf(set), err)
		}
	}
	return err
}

// dirSet is a set of goose files in dir, which must hold at least one.
func dirSet(name, dir string) (migrations.Set, error) {
	if dir == "" {
		return migrations.Set{}, errors.New("DIR is empty")
	}
	st, err := os.Stat(dir)
	if err != nil {
		return migrations.Set{}, err
	}
	if !st.IsDir() {
		return migrations.Set{}, fmt.Errorf("%s is not a directory", dir)
	}
	fsys := os.DirFS(dir)
	files, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return migrations.Set{}, err
	}
	if len(files) == 0 {
		return migrations.Set{}, fmt.Errorf("no .sql file in %s", dir)
	}
	return migrations.Set{Name: name, FS: fsys, VersionTable: name + "_schema_migrations"}, nil
}

// forward is what up and status work on: the framework's set first,
// whether named or not (every other set builds on its tables), then the
// others in the order named, the webhook package's just before the app's
// whether named or not (the app's 00034 builds on its tables). The version
// tables are checked as migrations.UpSets does, before anything runs.
func (f *setFlags) forward() ([]migrations.Set, error) {
	named, err := f.resolve()
	if err != nil {
		return nil, err
	}
	sets := []migrations.Set{migrations.Framework()}
	app := slices.ContainsFunc(named, func(s migrations.Set) bool { return s.Name == setApp })
	for _, s := range named {
		switch {
		case s.Name == setFramework, s.Name == setWebhooks && app:
		case s.Name == setApp:
			sets = append(sets, appmigrations.Sets()...)
		default:
			sets = append(sets, s)
		}
	}
	for i, s := range sets {
		for _, o := range sets[:i] {
			if o.VersionTable == s.VersionTable {
				return nil, fmt.Errorf("invalid --version-table: sets %s and %s share the version table %s", o.Name, s.Name, s.VersionTable)
			}
		}
	}
	return sets, nil
}

func newMigrateCmd(e *env) *cobra.Command {
	var flags setFlags
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply, inspect or roll back the database schema: the framework's set, and the sets named with --set",
		Long: "Migration sets, each with its own version table, in the first schema of DATABASE_URL's\n" +
			"search_path: always the framework's (outflow_migrations), then those named with --set, in\n" +
			"that order. The reference payments app's set (app_schema_migrations) is one of them, applied\n" +
			"only when named: `outflow migrate up --set app`, which applies the webhook package's set\n" +
			"(" + webhookschema.VersionTable + ", `--set webhooks` alone) just before it.\n" +
			"A service's own set is a directory of goose\n" +
			"files: `--set refunds=db/migrations` (version table refunds_schema_migrations, or the one\n" +
			"--version-table refunds=TABLE names). A database migrated by a release with a single set\n" +
			"(outflow_schema_migrations) is adopted by the framework's and the app's sets on `up`.",
	}
	flags.register(cmd)
	var sets []migrations.Set
	check := func() error {
		var err error
		sets, err = flags.forward()
		return err
	}
	withDB := func(check func() error, run func(cmd *cobra.Command, db *sql.DB, pool *pgxpool.Pool) error) func(*cobra.Command, []string) error {
		return e.withPool(check, func(cmd *cobra.Command, pool *pgxpool.Pool) error {
			db := stdlib.OpenDBFromPool(pool)
			defer db.Close()
			return run(cmd, db, pool)
		})
	}
	migrator := func(db *sql.DB, set migrations.Set) (*migrations.Migrator, error) {
		return migrations.NewMigrator(db, set, migrations.Config{})
	}
	down := &cobra.Command{
		Use:   "down",
		Short: "Roll back the most recent migration of the one set --set names",
		Long: "Rolls back one migration of one set, the one --set names (required: rolling back is never\n" +
			"a default). Roll a service's sets back before the framework's, on whose tables they build,\n" +
			"and the app's before the webhook package's (`--set webhooks`).",
		Args: cobra.NoArgs,
		RunE: withDB(func() error {
			named, err := flags.resolve()
			if err != nil {
				return err
			}
			if len(named) != 1 {
				return fmt.Errorf("invalid --set: down rolls back one set: name exactly one (--set %s, --set %s, --set %s or --set NAME=DIR), got %d",
					setFramework, setWebhooks, setApp, len(named))
			}
			sets = named
			return nil
		}, func(cmd *cobra.Command, db *sql.DB, _ *pgxpool.Pool) error {
			if err := flags.checkVersionTables(cmd.Context(), db, sets); err != nil {
				return err
			}
			m, err := migrator(db, sets[0])
			if err != nil {
				return err
			}
			r, err := m.Down(cmd.Context())
			if err != nil {
				return flags.flagError(err, sets)
			}
			if r == nil {
				fmt.Fprintf(cmd.OutOrStdout(), "nothing to roll back in %s\n", sets[0].Name)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "rolled back %s %d %s\n", sets[0].Name, r.Version, r.Name)
			return nil
		}),
	}
	var statusAsJSON bool
	status := &cobra.Command{
		Use:   "status",
		Short: "List the migrations of the framework's set and of those --set names, and whether each is applied",
		Args:  cobra.NoArgs,
		RunE: withDB(check, func(cmd *cobra.Command, db *sql.DB, _ *pgxpool.Pool) error {
			type row struct {
				Set     string `json:"set"`
				Version int64  `json:"version"`
				Name    string `json:"name"`
				Applied bool   `json:"applied"`
			}
			if err := flags.checkVersionTables(cmd.Context(), db, sets); err != nil {
				return err
			}
			var rows []row
			for _, set := range sets {
				m, err := migrator(db, set)
				if err != nil {
					return err
				}
				ss, err := m.Status(cmd.Context())
				if err != nil {
					return flags.flagError(err, sets)
				}
				for _, s := range ss {
					rows = append(rows, row{set.Name, s.Version, s.Name, s.Applied})
				}
			}
			if statusAsJSON {
				return printList(cmd, rows)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SET\tVERSION\tNAME\tSTATE")
			for _, r := range rows {
				state := "pending"
				if r.Applied {
					state = "applied"
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", r.Set, r.Version, r.Name, state)
			}
			return tw.Flush()
		}),
	}
	status.Flags().BoolVar(&statusAsJSON, "json", false, "print a JSON array of the migrations")
	cmd.AddCommand(
		&cobra.Command{
			Use:   "up",
			Short: "Apply every pending migration: the framework's set, then those --set names, in order (a no-op when up to date)",
			Args:  cobra.NoArgs,
			RunE: withDB(check, func(cmd *cobra.Command, db *sql.DB, pool *pgxpool.Pool) error {
				if err := flags.checkVersionTables(cmd.Context(), db, sets); err != nil {
					return err
				}
				applied, err := migrations.UpSets(cmd.Context(), db, migrations.Config{}, sets...)
				for _, a := range applied {
					fmt.Fprintf(cmd.OutOrStdout(), "applied %s %d %s\n", a.Set, a.Version, a.Name)
				}
				if err != nil {
					return flags.flagError(err, sets)
				}
				if len(applied) == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "schema is up to date")
				}
				return warnAppNotNamed(cmd, pool, sets)
			}),
		},
		down,
		status,
	)
	return cmd
}

// warnAppNotNamed says, on a database where the reference app's set is
// installed (appInstalled), that `up` left it alone: its operator, used to
// the releases that applied it by default, learns the flag now rather than
// from a failing query of a migration never run.
func warnAppNotNamed(cmd *cobra.Command, pool *pgxpool.Pool, sets []migrations.Set) error {
	if slices.ContainsFunc(sets, func(s migrations.Set) bool { return s.Name == setApp }) {
		return nil
	}
	installed, err := appInstalled(cmd.Context(), pool)
	if err != nil || !installed {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "note: the reference app's tables are installed here and were not migrated: add --set %s to migrate them\n", setApp)
	return nil
}
