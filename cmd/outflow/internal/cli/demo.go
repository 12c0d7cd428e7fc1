package cli

import (
	"context"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/outflow-dev/outflow/app/apikey"
	"github.com/outflow-dev/outflow/cmd/outflow/internal/demo"
)

func newDemoCmd(e *env) *cobra.Command {
	var cfg demo.Config
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Drive payments through a running API and report what reached the outbox",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := e.load()
			if err != nil {
				return err
			}
			if cfg.APIURL == "" {
				cfg.APIURL = "http://" + c.HTTPAddr
			}
			pool, err := openPool(cmd.Context(), c.DatabaseURL)
			if err != nil {
				return err
			}
			defer pool.Close()
			cfg.Pool = pool
			cfg.Out = cmd.OutOrStdout()
			if cfg.APIKey == "" {
				cfg.APIKey = os.Getenv("OUTFLOW_API_KEY")
			}
			if cfg.APIKey == "" {
				// A key for this run only, revoked when it ends.
				k, err := apikey.Create(cmd.Context(), pool, apikey.New{Name: "outflow demo (temporary)"})
				if err != nil {
					return err
				}
				defer func() { _, _ = apikey.Revoke(context.WithoutCancel(cmd.Context()), pool, k.ID) }()
				cfg.APIKey = k.Secret
			}
			return demo.Run(cmd.Context(), cfg)
		},
	}
	cmd.Flags().StringVar(&cfg.APIURL, "api-url", "", "payments API base URL (default http://$HTTP_ADDR)")
	cmd.Flags().StringVar(&cfg.APIKey, "api-key", "", "an admin API key (env OUTFLOW_API_KEY; neither: a temporary one, made in the database and revoked at the end)")
	cmd.Flags().IntVar(&cfg.Payments, "payments", 300, "how many payments to create")
	cmd.Flags().IntVar(&cfg.Concurrency, "concurrency", 8, "concurrent API clients")
	cmd.Flags().BoolVar(&cfg.Consumers, "consumers", true, "wait for the workers and verify their effects (analytics, webhooks)")
	cmd.Flags().Float64Var(&cfg.Rate, "rate", 0, "payments started per second (0: as fast as the API answers)")
	cmd.Flags().DurationVar(&cfg.ForwardTimeout, "forward-timeout", 30*time.Second, "how long to wait for the run's events to be forwarded and handled (0: do not wait)")
	return cmd
}
