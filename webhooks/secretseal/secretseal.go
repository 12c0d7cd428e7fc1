package secretseal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// KeyEnv is the environment variable the operator supplies the key in.
const KeyEnv = "OUTFLOW_SECRET_KEY"

// KeySize is the key's length in bytes.
const KeySize = 32

const prefix = "enc:v1:"

// Sentinel errors callers branch on.
var (
	// ErrNoKey: a sealed secret, and no key to open it.
	ErrNoKey = errors.New(KeyEnv + " is not set")
	// ErrWrongKey: sealed with another key, or altered.
	ErrWrongKey = errors.New("does not open with " + KeyEnv)
)

// Key seals and opens secrets. The zero value is not usable; a nil *Key
// means no key was supplied.
type Key struct {
	aead cipher.AEAD
	id   string
}

// ParseKey reads a key in its configured form: the standard base64
// (padded or not) of 32 random bytes, as `openssl rand -base64 32` prints.
// Its errors never echo the value.
func ParseKey(s string) (*Key, error) {
	s = strings.TrimSpace(s)
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		b, err = base64.RawStdEncoding.DecodeString(s)
	}
	if err != nil {
		return nil, fmt.Errorf("want the base64 of %d random bytes (such as `openssl rand -base64 %d` prints): not valid base64",
			KeySize, KeySize)
	}
	if len(b) != KeySize {
		return nil, fmt.Errorf("want the base64 of %d random bytes (such as `openssl rand -base64 %d` prints), not of %d bytes",
			KeySize, KeySize, len(b))
	}
	return NewKey(b)
}

// NewKey returns the key of 32 raw bytes.
func NewKey(raw []byte) (*Key, error) {
	if len(raw) != KeySize {
		return nil, fmt.Errorf("secret key: want %d bytes, not %d", KeySize, len(raw))
	}
	block, err := aes.NewCipher(raw)
	if err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	sum := sha256.Sum256(append([]byte("outflow secret key id\x00"), raw...))
	return &Key{aead: aead, id: hex.EncodeToString(sum[:4])}, nil
}

// ID names the key without revealing it.
func (k *Key) ID() string { return k.id }

// Seal encrypts secret for the merchant owner (the associated data).
func (k *Key) Seal(secret, owner string) (string, error) {
	nonce := make([]byte, k.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("seal secret: %w", err)
	}
	out := k.aead.Seal(nonce, nonce, []byte(secret), []byte(owner))
	return prefix + k.id + ":" + base64.StdEncoding.EncodeToString(out), nil
}

// Sealed reports whether stored is a sealed secret rather than plaintext.
func Sealed(stored string) bool { return strings.HasPrefix(stored, prefix) }

// Open returns the secret stored for owner: stored itself when it is
// plaintext (k may then be nil), else its decryption with k. Its errors
// match [ErrNoKey] or [ErrWrongKey] and never include the secret.
func Open(k *Key, stored, owner string) (string, error) {
	if !Sealed(stored) {
		return stored, nil
	}
	if k == nil {
		return "", fmt.Errorf("open webhook secret: it is sealed and %w", ErrNoKey)
	}
	id, data, ok := strings.Cut(strings.TrimPrefix(stored, prefix), ":")
	if !ok {
		return "", fmt.Errorf("open webhook secret: malformed sealed value: %w", ErrWrongKey)
	}
	if id != k.id {
		return "", fmt.Errorf("open webhook secret: sealed with key %s, %s is key %s: %w", id, KeyEnv, k.id, ErrWrongKey)
	}
	raw, err := base64.StdEncoding.DecodeString(data)
	if err != nil || len(raw) < k.aead.NonceSize() {
		return "", fmt.Errorf("open webhook secret: malformed sealed value: %w", ErrWrongKey)
	}
	n := k.aead.NonceSize()
	plain, err := k.aead.Open(nil, raw[:n], raw[n:], []byte(owner))
	if err != nil {
		return "", fmt.Errorf("open webhook secret: authentication failed (altered, or not this merchant's): %w", ErrWrongKey)
	}
	return string(plain), nil
}
