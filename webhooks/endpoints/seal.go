package endpoints

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/secretseal"
)

// SealSecrets seals with key every signing secret still stored in
// plaintext (written before the key was set), current and previous, in
// batches of batch endpoints, each with its endpoint's id as associated
// data, and returns how many endpoints it changed. It is idempotent and
// safe while the service runs: a row is sealed only if it still holds
// what was read (a rotation meanwhile wins, and its row is read again).
func SealSecrets(ctx context.Context, db webhooks.DB, key *secretseal.Key, batch int) (int, error) {
	if key == nil {
		return 0, fmt.Errorf("seal webhook secrets: %w", secretseal.ErrNoKey)
	}
	if batch < 1 {
		return 0, errors.New("seal webhook secrets: batch must be at least 1")
	}
	// "enc:" rather than secretseal's "enc:v1:": a value sealed in a later
	// form must not be sealed again.
	plain := func(s string) bool { return !strings.HasPrefix(s, "enc:") }
	total := 0
	for {
		type row struct {
			id, cur string
			prev    *string
		}
		var rows []row
		r, err := db.Query(ctx, `
			SELECT id::text, secret, previous_secret FROM webhook_endpoints
			WHERE secret NOT LIKE 'enc:%' OR previous_secret NOT LIKE 'enc:%'
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
		r.Close()
		if err := r.Err(); err != nil {
			return total, fmt.Errorf("seal webhook secrets: %w", err)
		}
		if len(rows) == 0 {
			return total, nil
		}
		for _, x := range rows {
			cur, prev := x.cur, x.prev
			if plain(cur) {
				if cur, err = key.Seal(cur, x.id); err != nil {
					return total, err
				}
			}
			if prev != nil && plain(*prev) {
				p, err := key.Seal(*prev, x.id)
				if err != nil {
					return total, err
				}
				prev = &p
			}
			// Compare-and-set: a rotation meanwhile wins.
			tag, err := db.Exec(ctx, `
				UPDATE webhook_endpoints SET secret = $2, previous_secret = $3
				WHERE id = $1 AND secret = $4 AND previous_secret IS NOT DISTINCT FROM $5`,
				x.id, cur, prev, x.cur, x.prev)
			if err != nil {
				return total, fmt.Errorf("seal webhook secrets: %w", err)
			}
			total += int(tag.RowsAffected())
		}
	}
}
