// Package cli implements the outflow command: its subcommands parse their
// configuration, build the components and run them. Nothing here holds
// logic that a library user would need.
package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outflow-dev/outflow/cmd/outflow/internal/config"
	"github.com/outflow-dev/outflow/internal/redact"
)

// Version is set at build time with -ldflags "-X .../internal/cli.Version=...".
var Version = ""

// env is what every subcommand gets from the root command.
type env struct {
	flags *config.Flags
}

// NewRoot returns the outflow command.
func NewRoot() *cobra.Command {
	root, _ := newRoot()
	return root
}

func newRoot() (*cobra.Command, *env) {
	e := &env{}
	root := &cobra.Command{
		Use:   "outflow",
		Short: "Transactional outbox for Go services on PostgreSQL and Watermill",
		Long: `Outflow writes every event of a PostgreSQL transaction into an outbox table in that
same transaction, and forwards committed events to a broker: never lost, never a lie.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	e.flags = config.Register(root.PersistentFlags())
	root.AddCommand(
		newMigrateCmd(e),
		newServeCmd(e),
		newForwardCmd(e),
		newRelayCmd(e),
		newWorkerCmd(e),
		newDLQCmd(e),
		newStatsCmd(e),
		newConsoleCmd(e),
		newOutboxCmd(e),
		newReplayCmd(e),
		newConsumerCmd(e),
		newDemoCmd(e),
		newAPIKeyCmd(e),
		newWebhookSecretsCmd(e),
		newEventsCmd(),
		newVersionCmd(),
	)
	return root, e
}

// Execute runs the outflow command and returns the process exit code.
func Execute(ctx context.Context) int {
	root, e := newRoot()
	stopTracing, err := setupTracing(ctx, os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "outflow:", err)
		return 1
	}
	defer stopTracing()
	if err := root.ExecuteContext(ctx); err != nil {
		// The redactor over the whole message: an error may quote a
		// connection string a library did not redact (all of it, or
		// a parameter it does not know is secret).
		fmt.Fprintln(os.Stderr, "outflow:", redact.Text(err.Error(), e.flags.ConnectionStrings()...))
		return 1
	}
	return 0
}

func (e *env) load() (config.Config, *slog.Logger, error) {
	cfg, err := e.flags.Load()
	if err != nil {
		return config.Config{}, nil, err
	}
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
	if cfg.LogFormat == "json" {
		h = slog.NewJSONHandler(os.Stderr, opts)
	}
	logger := slog.New(redact.Handler(h, e.flags.ConnectionStrings()...))
	return cfg, logger, nil
}

// withPool loads the configuration, connects to the database and runs fn,
// closing the pool after it. check runs first, for flag errors that need no
// database.
func (e *env) withPool(check func() error, fn func(cmd *cobra.Command, pool *pgxpool.Pool) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		if check != nil {
			if err := check(); err != nil {
				return err
			}
		}
		cfg, _, err := e.load()
		if err != nil {
			return err
		}
		pool, err := openPool(cmd.Context(), cfg.DatabaseURL)
		if err != nil {
			return err
		}
		defer pool.Close()
		return fn(cmd, pool)
	}
}

func openPool(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL at %s: %w (is it running? try `make services-up`)", redact.URL(dbURL), err)
	}
	return pool, nil
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "outflow", version())
		},
	}
}

func version() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return "dev-" + s.Value[:12]
			}
		}
		if bi.Main.Version != "" {
			return bi.Main.Version
		}
	}
	return "dev"
}
