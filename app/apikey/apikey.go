package apikey

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Scheme is what every key starts with, so that a leaked key is easy to
// recognise (secret scanners, logs).
const Scheme = "ofk_"

// prefixLen is how much of a key `list` shows: the scheme and 8 characters
// (48 bits), enough to tell keys apart, leaving 208 secret bits.
const prefixLen = len(Scheme) + 8

// MaxNameLen bounds a key's name, in characters.
const MaxNameLen = 200

// Sentinel errors callers branch on.
var (
	// ErrNotFound: no key has that id.
	ErrNotFound = errors.New("api key not found")
	// ErrUnknownMerchant: the merchant a key was to be made for does not exist.
	ErrUnknownMerchant = errors.New("no such merchant")
	// ErrInvalidName: the name is too long, or holds control characters
	// or invalid UTF-8.
	ErrInvalidName = errors.New("invalid api key name")
)

// Querier is what both a pool and a transaction offer.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Key is what the database holds of an API key: never the key itself.
type Key struct {
	ID     string `json:"id"`
	Prefix string `json:"prefix"`
	Name   string `json:"name"`
	// MerchantID is empty for an admin key.
	MerchantID string     `json:"merchant_id,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
}

// Admin reports whether the key may act on every merchant.
func (k Key) Admin() bool { return k.MerchantID == "" }

// New is the input of [Create].
type New struct {
	// Name helps people tell keys apart; optional.
	Name string
	// MerchantID is the merchant the key acts for; empty makes an admin key.
	MerchantID string
}

// Created is a new key with its secret, which exists only here.
type Created struct {
	Key
	Secret string `json:"api_key"`
}

// ValidateName checks a key's name; surrounding space is trimmed.
func ValidateName(name string) error {
	name = strings.TrimSpace(name)
	switch {
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: must be valid UTF-8", ErrInvalidName)
	case utf8.RuneCountInString(name) > MaxNameLen:
		return fmt.Errorf("%w: must be at most %d characters", ErrInvalidName, MaxNameLen)
	case strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Errorf("%w: must not contain control characters", ErrInvalidName)
	}
	return nil
}

// Create stores a new key and returns it with its secret. With q a
// transaction, the key exists exactly when that transaction commits.
func Create(ctx context.Context, q Querier, in New) (Created, error) {
	if err := ValidateName(in.Name); err != nil {
		return Created{}, err
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return Created{}, fmt.Errorf("generate api key: %w", err)
	}
	secret := Scheme + base64.RawURLEncoding.EncodeToString(raw)
	id, err := uuid.NewV7()
	if err != nil {
		return Created{}, fmt.Errorf("new api key id: %w", err)
	}
	k := Key{ID: id.String(), Prefix: secret[:prefixLen], Name: strings.TrimSpace(in.Name), MerchantID: in.MerchantID}
	var merchant *string
	if in.MerchantID != "" {
		merchant = &in.MerchantID
	}
	err = q.QueryRow(ctx, `
		INSERT INTO api_keys (id, prefix, key_hash, name, merchant_id) VALUES ($1, $2, $3, $4, $5)
		RETURNING created_at`, k.ID, k.Prefix, hash(secret), k.Name, merchant).Scan(&k.CreatedAt)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "23503" || pgErr.Code == "22P02") { // foreign key; not a uuid
		return Created{}, ErrUnknownMerchant
	}
	if err != nil {
		return Created{}, fmt.Errorf("insert api key: %w", err)
	}
	k.CreatedAt = k.CreatedAt.UTC()
	return Created{Key: k, Secret: secret}, nil
}

// PrefixOf is the prefix a key with this secret is listed by (its
// Key.Prefix), or "" when secret is not shaped like a key. It says which
// key a secret claims to be without looking it up.
func PrefixOf(secret string) string {
	if !strings.HasPrefix(secret, Scheme) || len(secret) < prefixLen {
		return ""
	}
	return secret[:prefixLen]
}

// Authenticate returns the live (not revoked) key whose secret is given.
// ok is false for an unknown or revoked key, and for anything that is not
// a key at all.
func Authenticate(ctx context.Context, q Querier, secret string) (k Key, ok bool, err error) {
	// A cheap shape check spares the database the obvious garbage.
	if !strings.HasPrefix(secret, Scheme) || len(secret) > 128 {
		return Key{}, false, nil
	}
	k, err = scanKey(q.QueryRow(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL`, hash(secret)))
	if errors.Is(err, pgx.ErrNoRows) {
		return Key{}, false, nil
	}
	if err != nil {
		return Key{}, false, fmt.Errorf("look up api key: %w", err)
	}
	return k, true, nil
}

// lastUsedResolution is how stale last_used_at may be: [Touch] writes at
// most once per key per this period, so a busy key costs no write per
// request.
const lastUsedResolution = time.Minute

// Touch records that k was used successfully, unless that was recorded
// less than a minute ago.
func Touch(ctx context.Context, q Querier, k Key) error {
	if k.LastUsedAt != nil && time.Since(*k.LastUsedAt) < lastUsedResolution {
		return nil
	}
	_, err := q.Exec(ctx, `UPDATE api_keys SET last_used_at = now()
		WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < now() - $2::interval)`, k.ID, lastUsedResolution.String())
	if err != nil {
		return fmt.Errorf("record api key use: %w", err)
	}
	return nil
}

// List returns every key, revoked ones too, oldest first.
func List(ctx context.Context, q Querier) ([]Key, error) {
	rows, err := q.Query(ctx, `SELECT `+keyColumns+` FROM api_keys ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Key, error) { return scanKey(r) })
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	return keys, nil
}

// Revoke revokes the key with that id at once: its next request is a 401.
// Revoking a revoked key changes nothing and returns it as it is.
func Revoke(ctx context.Context, q Querier, id string) (Key, error) {
	if _, err := uuid.Parse(id); err != nil || len(id) != 36 {
		return Key{}, ErrNotFound
	}
	_, err := q.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL`, id)
	if err != nil {
		return Key{}, fmt.Errorf("revoke api key: %w", err)
	}
	k, err := scanKey(q.QueryRow(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Key{}, ErrNotFound
	}
	if err != nil {
		return Key{}, fmt.Errorf("read api key: %w", err)
	}
	return k, nil
}

const keyColumns = `id::text, prefix, name, coalesce(merchant_id::text, ''), created_at, revoked_at, last_used_at`

func scanKey(row pgx.Row) (Key, error) {
	var k Key
	if err := row.Scan(&k.ID, &k.Prefix, &k.Name, &k.MerchantID, &k.CreatedAt, &k.RevokedAt, &k.LastUsedAt); err != nil {
		return Key{}, err
	}
	k.CreatedAt = k.CreatedAt.UTC()
	for _, t := range []*time.Time{k.RevokedAt, k.LastUsedAt} {
		if t != nil {
			*t = t.UTC()
		}
	}
	return k, nil
}

func hash(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}
