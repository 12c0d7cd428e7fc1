package cli

import (
	"database/sql"
	"fmt"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/spf13/cobra"

	"github.com/outflow-dev/outflow/migrations"
)

func newMigrateCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply, inspect or roll back the database schema",
	}
	withDB := func(run func(cmd *cobra.Command, db *sql.DB) error) func(*cobra.Command, []string) error {
		return e.withPool(nil, func(cmd *cobra.Command, pool *pgxpool.Pool) error {
			db := stdlib.OpenDBFromPool(pool)
			defer db.Close()
			return run(cmd, db)
		})
	}
	cmd.AddCommand(
		&cobra.Command{
			Use:   "up",
			Short: "Apply every pending migration (a no-op when up to date)",
			Args:  cobra.NoArgs,
			RunE: withDB(func(cmd *cobra.Command, db *sql.DB) error {
				rs, err := migrations.Up(cmd.Context(), db)
				if err != nil {
					return err
				}
				if len(rs) == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "schema is up to date")
				}
				for _, r := range rs {
					fmt.Fprintf(cmd.OutOrStdout(), "applied %d %s\n", r.Version, r.Name)
				}
				return nil
			}),
		},
		&cobra.Command{
			Use:   "down",
			Short: "Roll back the most recent migration",
			Args:  cobra.NoArgs,
			RunE: withDB(func(cmd *cobra.Command, db *sql.DB) error {
				r, err := migrations.Down(cmd.Context(), db)
				if err != nil {
					return err
				}
				if r == nil {
					fmt.Fprintln(cmd.OutOrStdout(), "nothing to roll back")
					return nil
				}
				fmt.Fprintf(cmd.OutOrStdout(), "rolled back %d %s\n", r.Version, r.Name)
				return nil
			}),
		},
		&cobra.Command{
			Use:   "status",
			Short: "List migrations and whether each is applied",
			Args:  cobra.NoArgs,
			RunE: withDB(func(cmd *cobra.Command, db *sql.DB) error {
				ss, err := migrations.CurrentStatus(cmd.Context(), db)
				if err != nil {
					return err
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "VERSION\tNAME\tSTATE")
				for _, s := range ss {
					state := "pending"
					if s.Applied {
						state = "applied"
					}
					fmt.Fprintf(tw, "%d\t%s\t%s\n", s.Version, s.Name, state)
				}
				return tw.Flush()
			}),
		},
	)
	return cmd
}
