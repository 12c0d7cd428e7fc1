package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/webhooks/webhookapi"
)

const (
	idempotencyHeader = "Idempotency-Key"
	replayedHeader    = "Idempotent-Replayed"
	maxKeyLen         = 255
)

// errKeyReused aborts the transaction of a request whose key belongs to
// another request.
var errKeyReused = errors.New("idempotency key reused with another request")

// command runs fn in one transaction and writes its result with status. With
// an Idempotency-Key, the key and the response are stored in that same
// transaction, so they exist exactly when the effect committed. A key
// belongs to the API key that sent it: the same Idempotency-Key from
// another API key is another request, and never replays this one's
// response.
func (a *API) command(w http.ResponseWriter, r *http.Request, in any, status int,
	fn func(context.Context, pgx.Tx) (any, error),
) {
	ctx := r.Context()
	key := r.Header.Get(idempotencyHeader)
	if len(key) > maxKeyLen {
		writeError(w, http.StatusBadRequest, "invalid_header", fmt.Sprintf("%s: at most %d characters", idempotencyHeader, maxKeyLen), idempotencyHeader)
		return
	}
	if !validHeaderText(key) {
		writeError(w, http.StatusBadRequest, "invalid_header", idempotencyHeader+": must be UTF-8 text without control characters", idempotencyHeader)
		return
	}
	owner, ok := principal(ctx)
	if !ok && key != "" {
		// Unreachable: every command route is authenticated. Refusing is the
		// safe answer should that change, rather than sharing keys.
		writeError(w, http.StatusUnauthorized, "unauthorized", "a valid API key is required: Authorization: Bearer <key>", "")
		return
	}
	var (
		body     []byte
		replayed bool
	)
	err := a.svc.InTx(ctx, func(tx pgx.Tx) error {
		if key != "" {
			hash, err := requestHash(r, in)
			if err != nil {
				return err
			}
			stored, code, ok, err := claimKey(ctx, tx, owner.ID, key, hash)
			if err != nil {
				return err
			}
			if ok {
				body, status, replayed = stored, code, true
				return nil
			}
		}
		out, err := fn(ctx, tx)
		if err != nil {
			return err
		}
		if body, err = json.Marshal(out); err != nil {
			return fmt.Errorf("encode response: %w", err)
		}
		if key == "" {
			return nil
		}
		stored := body
		var replay any
		switch rp := out.(type) {
		case shownOnce:
			replay = rp.replay()
		case webhookapi.ShownOncer: // a webhook endpoint created, a secret rotated
			replay = rp.ShownOnce()
		}
		if replay != nil {
			if stored, err = json.Marshal(replay); err != nil {
				return fmt.Errorf("encode response: %w", err)
			}
		}
		return saveResponse(ctx, tx, owner.ID, key, status, stored)
	})
	switch {
	case errors.Is(err, errKeyReused):
		writeError(w, http.StatusUnprocessableEntity, "idempotency_key_reused",
			"this Idempotency-Key was used with a different request", idempotencyHeader)
		return
	case errors.As(err, new(*outbox.EventTooLargeError)):
		// Nothing was committed: the transaction rolled back with the
		// event (and the Idempotency-Key's claim). 413, as for a body
		// too large: the request is well formed, what it would publish is
		// more than the outbox takes; sending less is the fix.
		writeEventTooLarge(w, in, err)
		return
	case err != nil:
		a.writeAppError(w, r, err)
		return
	}
	if replayed {
		w.Header().Set(replayedHeader, "true")
	}
	writeRaw(w, status, body)
}

// requestHash fingerprints the request: method, path and the decoded body
// re-encoded, so that formatting differences do not count as another request.
func requestHash(r *http.Request, in any) ([]byte, error) {
	canon, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s %s\n", r.Method, r.URL.Path)
	h.Write(canon)
	return h.Sum(nil), nil
}

// claimKey inserts the key's row or, if the key exists, returns its stored
// response. The INSERT waits on the unique index while another transaction
// holds the same key, so concurrent retries serialize behind the first.
func claimKey(ctx context.Context, tx pgx.Tx, owner, key string, hash []byte) (body []byte, status int, found bool, err error) {
	tag, err := tx.Exec(ctx, `
		INSERT INTO idempotency_keys (api_key_id, key, request_hash, status_code, response_body) VALUES ($1, $2, $3, 0, '')
		ON CONFLICT (api_key_id, key) DO NOTHING`, owner, key, hash)
	if err != nil {
		return nil, 0, false, fmt.Errorf("claim idempotency key: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return nil, 0, false, nil
	}
	var storedHash []byte
	err = tx.QueryRow(ctx, `SELECT request_hash, status_code, response_body FROM idempotency_keys WHERE api_key_id = $1 AND key = $2`, owner, key).
		Scan(&storedHash, &status, &body)
	if err != nil {
		return nil, 0, false, fmt.Errorf("read idempotency key: %w", err)
	}
	if !bytes.Equal(storedHash, hash) {
		return nil, 0, false, errKeyReused
	}
	return body, status, true, nil
}

func saveResponse(ctx context.Context, tx pgx.Tx, owner, key string, status int, body []byte) error {
	_, err := tx.Exec(ctx, `UPDATE idempotency_keys SET status_code = $3, response_body = $4 WHERE api_key_id = $1 AND key = $2`,
		owner, key, status, body)
	if err != nil {
		return fmt.Errorf("save idempotent response: %w", err)
	}
	return nil
}
