package cli

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outflow-dev/outflow/app/apikey"
	"github.com/outflow-dev/outflow/internal/actionlog"
)

// apiKeyTarget is what `apikey create` and `apikey revoke` record: the
// key's id, prefix and name, never the key.
type apiKeyTarget struct {
	KeyID      string `json:"key_id,omitempty"`
	Prefix     string `json:"prefix,omitempty"`
	Name       string `json:"name,omitempty"`
	Admin      bool   `json:"admin,omitempty"`
	MerchantID string `json:"merchant_id,omitempty"`
}

func newAPIKeyCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "apikey",
		Short: "Create, list and revoke the payments API's keys (stored hashed: a key is shown once)",
	}
	var (
		admin    bool
		merchant string
		name     string
	)
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a key and print it, and nothing else, on stdout",
		Long: `Create an API key and print it on stdout, alone, so that a script can capture it:

  OUTFLOW_API_KEY=$(outflow apikey create --admin --name ops)

An admin key (--admin) may do everything, on every merchant; a merchant's key
(--merchant ID) acts on that merchant only. The key is shown once: only its
hash is stored.`,
		Args: cobra.NoArgs,
		RunE: e.withPool(func() error {
			if admin == (merchant != "") {
				return errors.New("give exactly one of --admin and --merchant ID")
			}
			if merchant != "" {
				u, err := uuid.Parse(merchant)
				if err != nil || len(merchant) != 36 {
					return fmt.Errorf("invalid --merchant: want a merchant id (a UUID), not %q", merchant)
				}
				merchant = u.String()
			}
			return apikey.ValidateName(name)
		}, func(cmd *cobra.Command, pool *pgxpool.Pool) error {
			// Recorded with the key's id and prefix, never the key.
			target := apiKeyTarget{Name: name, Admin: admin, MerchantID: merchant}
			var k apikey.Created
			_, err := e.recorded(cmd, nil, pool, actionlog.Entry{Action: "apikey.create", Target: &target},
				func(ctx context.Context, tx pgx.Tx) (int64, error) {
					var err error
					if k, err = apikey.Create(ctx, tx, apikey.New{Name: name, MerchantID: merchant}); err != nil {
						return 0, err
					}
					target.KeyID, target.Prefix = k.ID, k.Prefix
					return 1, nil
				})
			if errors.Is(err, apikey.ErrUnknownMerchant) {
				return fmt.Errorf("invalid --merchant: no merchant %s", merchant)
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.ErrOrStderr(), "created API key", k.ID, "("+k.Prefix+"...); the key is on stdout, shown this once")
			_, err = fmt.Fprintln(cmd.OutOrStdout(), k.Secret)
			return err
		}),
	}
	create.Flags().BoolVar(&admin, "admin", false, "an admin key: every merchant, every endpoint")
	create.Flags().StringVar(&merchant, "merchant", "", "a key of this merchant (id) only")
	create.Flags().StringVar(&name, "name", "", "a name to tell the key by")

	var listAsJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List every key (never the keys themselves): id, prefix, name, merchant, dates",
		Args:  cobra.NoArgs,
		RunE: e.withPool(nil, func(cmd *cobra.Command, pool *pgxpool.Pool) error {
			keys, err := apikey.List(cmd.Context(), pool)
			if err != nil {
				return err
			}
			if listAsJSON {
				return printList(cmd, keys)
			}
			out := cmd.OutOrStdout()
			if len(keys) == 0 {
				fmt.Fprintln(out, "no API keys (create one: outflow apikey create --admin)")
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tPREFIX\tNAME\tMERCHANT\tCREATED\tLAST USED\tREVOKED")
			for _, k := range keys {
				m := k.MerchantID
				if k.Admin() {
					m = "(admin)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Prefix, orDash(k.Name), m,
					k.CreatedAt.Format(time.RFC3339), timeOrDash(k.LastUsedAt), timeOrDash(k.RevokedAt))
			}
			return tw.Flush()
		}),
	}

	list.Flags().BoolVar(&listAsJSON, "json", false, "print a JSON array of the keys (never the keys themselves)")

	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a key: its next request is a 401",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			return e.withPool(nil, func(cmd *cobra.Command, pool *pgxpool.Pool) error {
				var k apikey.Key
				_, err := e.recorded(cmd, args, pool, actionlog.Entry{Action: "apikey.revoke", Target: apiKeyTarget{KeyID: id}},
					func(ctx context.Context, tx pgx.Tx) (int64, error) {
						var err error
						k, err = apikey.Revoke(ctx, tx, id)
						return 1, err
					})
				if errors.Is(err, apikey.ErrNotFound) {
					return fmt.Errorf("no API key with id %q (see outflow apikey list)", id)
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "revoked %s (%s...) at %s\n", k.ID, k.Prefix, k.RevokedAt.Format(time.RFC3339))
				return nil
			})(cmd, args)
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func timeOrDash(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.RFC3339)
}
