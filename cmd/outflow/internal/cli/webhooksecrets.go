package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/cmd/outflow/internal/config"
	"github.com/outflow-dev/outflow/internal/actionlog"
	"github.com/outflow-dev/outflow/webhooks/endpoints"
	"github.com/outflow-dev/outflow/webhooks/secretseal"
)

// warnPlaintextSecrets says, once per process at start, that webhook
// secrets are stored as given, and what the webhook policy is when it is
// the development one.
func warnPlaintextSecrets(cfg config.Config, logger *slog.Logger) {
	if cfg.SecretKey == nil {
		logger.Warn(secretseal.KeyEnv + " is not set: webhook secrets are stored in plaintext; set it to the base64 of 32 random bytes " +
			"(`openssl rand -base64 32`), then run `outflow webhook-secrets seal` once")
	}
	if cfg.WebhookAllowPrivate {
		logger.Warn("--webhook-allow-private is on: webhooks may target plain http and private, loopback and link-local addresses " +
			"(local development only)")
	}
}

// secretGrace maps the configured grace (0: none) onto app.Config's
// (0: the default; negative: none).
func secretGrace(cfg config.Config) time.Duration {
	if cfg.WebhookSecretGrace == 0 {
		return -1
	}
	return cfg.WebhookSecretGrace
}

func newWebhookSecretsCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "webhook-secrets",
		Short: "Manage the merchants' webhook secrets at rest",
	}
	var batch int
	seal := &cobra.Command{
		Use:   "seal",
		Short: "Encrypt with " + secretseal.KeyEnv + " every webhook secret still stored in plaintext (idempotent; safe while the service runs)",
		Args:  cobra.NoArgs,
	}
	var key *secretseal.Key
	seal.RunE = e.withPool(func() error {
		if batch < 1 {
			return errors.New("invalid --batch: must be at least 1")
		}
		cfg, _, err := e.load()
		if err != nil {
			return err
		}
		if cfg.SecretKey == nil {
			return fmt.Errorf("%s is not set: give it the base64 of 32 random bytes (`openssl rand -base64 32`)", secretseal.KeyEnv)
		}
		key = cfg.SecretKey
		return nil
	}, func(cmd *cobra.Command, pool *pgxpool.Pool) error {
		// Sealed in batches, each committed: recorded after, with how
		// many merchants and the key's id (never the key).
		if err := actionlog.Ready(cmd.Context(), pool); err != nil {
			return err
		}
		// The merchants' rows first: 00034's trigger carries each to the
		// merchant's endpoint (sealed with the merchant id, which is the
		// endpoint's); then the endpoints made through the endpoints API.
		n, err := app.SealWebhookSecrets(cmd.Context(), pool, key, batch)
		var eps int
		if err == nil {
			eps, err = endpoints.SealSecrets(cmd.Context(), pool, key, batch)
		}
		err = e.recordAfter(cmd, nil, pool, actionlog.Entry{Action: "webhook-secrets.seal",
			Target: map[string]string{"key_id": key.ID()}}, int64(n+eps), err)
		if err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "sealed the webhook secrets of %d merchants and %d other webhook endpoints with key %s\n",
			n, eps, key.ID())
		return nil
	})
	seal.Flags().IntVar(&batch, "batch", 500, "merchants, then webhook endpoints, read at once")
	cmd.AddCommand(seal)
	return cmd
}
