package cli

import (
	"database/sql"
	"fmt"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/spf13/cobra"

	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/migrations"
)

// migrationSets are applied in this order and rolled back in the reverse:
// the app's tables sit on the framework's.
func migrationSets() []migrations.Set {
	return []migrations.Set{migrations.Framework(), appmigrations.Set()}
}

func newMigrateCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply, inspect or roll back the database schema",
		Long: "Two migration sets, each with its own version table, in the first schema of\n" +
			"DATABASE_URL's search_path: the framework's (outflow_migrations), then the\n" +
			"reference app's (app_schema_migrations). A database migrated by a release\n" +
			"with a single set (outflow_schema_migrations) is adopted by both on `up`.",
	}
	withDB := func(run func(cmd *cobra.Command, db *sql.DB) error) func(*cobra.Command, []string) error {
		return e.withPool(nil, func(cmd *cobra.Command, pool *pgxpool.Pool) error {
			db := stdlib.OpenDBFromPool(pool)
			defer db.Close()
			return run(cmd, db)
		})
	}
	migrator := func(db *sql.DB, set migrations.Set) (*migrations.Migrator, error) {
		return migrations.NewMigrator(db, set, migrations.Config{})
	}
	var downSet string
	down := &cobra.Command{
		Use:   "down",
		Short: "Roll back the most recent migration (of the app's set while it has one, else the framework's)",
		Args:  cobra.NoArgs,
		RunE: withDB(func(cmd *cobra.Command, db *sql.DB) error {
			sets := migrationSets()
			if downSet != "" {
				var chosen []migrations.Set
				for _, s := range sets {
					if s.Name == downSet {
						chosen = append(chosen, s)
					}
				}
				if len(chosen) == 0 {
					return fmt.Errorf("invalid --set %q: want %q or %q", downSet, sets[0].Name, sets[1].Name)
				}
				sets = chosen
			}
			for i := len(sets) - 1; i >= 0; i-- {
				m, err := migrator(db, sets[i])
				if err != nil {
					return err
				}
				r, err := m.Down(cmd.Context())
				if err != nil {
					return err
				}
				if r != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "rolled back %s %d %s\n", sets[i].Name, r.Version, r.Name)
					return nil
				}
			}
			fmt.Fprintln(cmd.OutOrStdout(), "nothing to roll back")
			return nil
		}),
	}
	down.Flags().StringVar(&downSet, "set", "", `roll back this set only: "outflow" (the framework's) or "app"`)
	var statusAsJSON bool
	status := &cobra.Command{
		Use:   "status",
		Short: "List migrations and whether each is applied",
		Args:  cobra.NoArgs,
		RunE: withDB(func(cmd *cobra.Command, db *sql.DB) error {
			type row struct {
				Set     string `json:"set"`
				Version int64  `json:"version"`
				Name    string `json:"name"`
				Applied bool   `json:"applied"`
			}
			var rows []row
			for _, set := range migrationSets() {
				m, err := migrator(db, set)
				if err != nil {
					return err
				}
				ss, err := m.Status(cmd.Context())
				if err != nil {
					return err
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
			Short: "Apply every pending migration, the framework's then the app's (a no-op when up to date)",
			Args:  cobra.NoArgs,
			RunE: withDB(func(cmd *cobra.Command, db *sql.DB) error {
				applied := 0
				for _, set := range migrationSets() {
					m, err := migrator(db, set)
					if err != nil {
						return err
					}
					rs, err := m.Up(cmd.Context())
					if err != nil {
						return err
					}
					for _, r := range rs {
						fmt.Fprintf(cmd.OutOrStdout(), "applied %s %d %s\n", set.Name, r.Version, r.Name)
					}
					applied += len(rs)
				}
				if applied == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "schema is up to date")
				}
				return nil
			}),
		},
		down,
		status,
	)
	return cmd
}
