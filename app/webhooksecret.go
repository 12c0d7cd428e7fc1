package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/webhooks/secretseal"
)

// DefaultWebhookSecretGrace is how long a rotated-out webhook secret stays
// valid when Config.WebhookSecretGrace is zero.
const DefaultWebhookSecretGrace = 24 * time.Hour

// RotatedSecret is the answer to a rotation: the new secret, shown once,
// and until when the previous one is still used to sign.
type RotatedSecret struct {
	MerchantID    string `json:"merchant_id"`
	WebhookSecret string `json:"webhook_secret"`
	// PreviousSecretExpiresAt is nil when the grace period is zero.
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
}

// storedSecret is secret as the merchants table keeps it: sealed when the
// service has a key, else plaintext.
func (s *Service) storedSecret(secret, merchantID string) (string, error) {
	if s.secretKey == nil {
		return secret, nil
	}
	sealed, err := s.secretKey.Seal(secret, merchantID)
	if err != nil {
		return "", fmt.Errorf("seal webhook secret: %w", err)
	}
	return sealed, nil
}

// RotateWebhookSecret gives a merchant a new webhook secret. The one it
// replaces stays valid for Config.WebhookSecretGrace: webhooks are signed
// with both until then, so the merchant can switch without losing one. A
// rotation during the grace period of another drops the oldest secret.
func (s *Service) RotateWebhookSecret(ctx context.Context, merchantID string) (RotatedSecret, error) {
	var out RotatedSecret
	err := s.InTx(ctx, func(tx pgx.Tx) (err error) {
		out, err = s.RotateWebhookSecretTx(ctx, tx, merchantID)
		return err
	})
	return out, err
}

// RotateWebhookSecretTx is RotateWebhookSecret in the caller's transaction.
func (s *Service) RotateWebhookSecretTx(ctx context.Context, tx pgx.Tx, merchantID string) (RotatedSecret, error) {
	id, ok := canonicalID(merchantID)
	if !ok {
		return RotatedSecret{}, &NotFoundError{Entity: "merchant", ID: merchantID}
	}
	secret, err := newWebhookSecret()
	if err != nil {
		return RotatedSecret{}, fmt.Errorf("generate webhook secret: %w", err)
	}
	stored, err := s.storedSecret(secret, id)
	if err != nil {
		return RotatedSecret{}, err
	}
	out := RotatedSecret{MerchantID: id, WebhookSecret: secret}
	var until *time.Time
	if s.secretGrace > 0 {
		t := s.nowUTC().Add(s.secretGrace)
		until = &t
	}
	// The previous secret is kept as stored: sealed for this merchant, or
	// plaintext.
	tag, err := tx.Exec(ctx, `
		UPDATE merchants
		SET previous_webhook_secret = CASE WHEN $3::timestamptz IS NULL THEN NULL ELSE webhook_secret END,
		    previous_webhook_secret_expires_at = $3, webhook_secret = $2
		WHERE id = $1`, id, stored, until)
	if err != nil {
		return RotatedSecret{}, fmt.Errorf("rotate webhook secret: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return RotatedSecret{}, &NotFoundError{Entity: "merchant", ID: merchantID}
	}
	out.PreviousSecretExpiresAt = until
	return out, nil
}

// SealWebhookSecrets seals, with key, every webhook secret still stored in
// plaintext (written before the key was set), current and previous, in
// batches of batch merchants, and returns how many merchants it changed.
// It is idempotent and safe while the service runs: a row is sealed only
// if it still holds the plaintext that was read.
func SealWebhookSecrets(ctx context.Context, pool *pgxpool.Pool, key *secretseal.Key, batch int) (int, error) {
	if key == nil {
		return 0, fmt.Errorf("seal webhook secrets: %w", secretseal.ErrNoKey)
	}
	if batch < 1 {
		return 0, errors.New("seal webhook secrets: batch must be at least 1")
	}
	total := 0
	for {
		type row struct {
			id, cur string
			prev    *string
		}
		var rows []row
		r, err := pool.Query(ctx, `
			SELECT id::text, webhook_secret, previous_webhook_secret FROM merchants
			WHERE webhook_secret NOT LIKE 'enc:%' OR previous_webhook_secret NOT LIKE 'enc:%'
			ORDER BY id LIMIT $1`, batch)
		if err != nil {
			return total, fmt.Errorf("seal webhook secrets: %w", err)
		}
		for r.Next() {
			var x row
			if err := r.Scan(&x.id, &x.cur, &x.prev); err != nil {
				r.Close()
				return total, fmt.Errorf("seal webhook secrets: %w", err)
			}
			rows = append(rows, x)
		}
		if err := r.Err(); err != nil {
			return total, fmt.Errorf("seal webhook secrets: %w", err)
		}
		if len(rows) == 0 {
			return total, nil
		}
		for _, x := range rows {
			cur, prev := x.cur, x.prev
			if !secretseal.Sealed(cur) {
				if cur, err = key.Seal(cur, x.id); err != nil {
					return total, err
				}
			}
			if prev != nil && !secretseal.Sealed(*prev) {
				p, err := key.Seal(*prev, x.id)
				if err != nil {
					return total, err
				}
				prev = &p
			}
			// Compare-and-set: a rotation meanwhile wins.
			if _, err := pool.Exec(ctx, `
				UPDATE merchants SET webhook_secret = $2, previous_webhook_secret = $3
				WHERE id = $1 AND webhook_secret = $4 AND previous_webhook_secret IS NOT DISTINCT FROM $5`,
				x.id, cur, prev, x.cur, x.prev); err != nil {
				return total, fmt.Errorf("seal webhook secrets: %w", err)
			}
			total++
		}
	}
}
