package signing

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// SecretPrefix starts every secret this package makes.
const SecretPrefix = "whsec_"

// Header names of a signed webhook.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// DefaultTolerance is how far a webhook's timestamp may be from the
// receiver's clock when Verify is given none: Standard Webhooks' 5 minutes.
const DefaultTolerance = 5 * time.Minute

// Errors Verify returns; callers branch on them.
var (
	// ErrBadSecret: the secret is not "whsec_" and base64.
	ErrBadSecret = errors.New("webhook secret is not base64")
	// ErrNoSignature: the request lacks a header, or its timestamp is
	// not a number.
	ErrNoSignature = errors.New("webhook signature headers missing or malformed")
	// ErrTimestamp: the timestamp is too far from now.
	ErrTimestamp = errors.New("webhook timestamp outside the tolerance")
	// ErrMismatch: no signature matches the secret.
	ErrMismatch = errors.New("webhook signature does not match")
)

// NewSecret returns a new secret: "whsec_" and the base64 of 32 random
// bytes.
func NewSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate webhook secret: %w", err)
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(b), nil
}

// CheckSecret reports whether secret has the form of a signing secret.
func CheckSecret(secret string) error {
	_, err := key(secret)
	return err
}

func key(secret string) ([]byte, error) {
	k, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, SecretPrefix))
	if err != nil || len(k) == 0 {
		return nil, ErrBadSecret
	}
	return k, nil
}

// Sign returns one signature: "v1," + base64(HMAC-SHA256(key, id + "." +
// timestamp + "." + body)), the key being the base64 part of secret.
func Sign(secret, id, timestamp string, body []byte) (string, error) {
	k, err := key(secret)
	if err != nil {
		return "", err
	}
	mac := hmac.New(sha256.New, k)
	mac.Write([]byte(id + "." + timestamp + "."))
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)), nil
}

// Header returns the webhook-signature header's value for every secret
// given (the current one first, then those still in their grace period),
// space-separated as the standard allows.
func Header(secrets []string, id, timestamp string, body []byte) (string, error) {
	if len(secrets) == 0 {
		return "", ErrBadSecret
	}
	sigs := make([]string, 0, len(secrets))
	for _, s := range secrets {
		sig, err := Sign(s, id, timestamp, body)
		if err != nil {
			return "", err
		}
		sigs = append(sigs, sig)
	}
	return strings.Join(sigs, " "), nil
}

// Verify checks a received webhook's headers against secret: the
// timestamp within tolerance of now (DefaultTolerance when zero), and one
// of the signatures matching. It is what a merchant's receiver runs; tests
// and the examples use it too.
func Verify(secret string, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	id, ts, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || ts == "" || sigs == "" {
		return ErrNoSignature
	}
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return ErrNoSignature
	}
	if tolerance == 0 {
		tolerance = DefaultTolerance
	}
	if d := now.Sub(time.Unix(secs, 0)); d > tolerance || d < -tolerance {
		return ErrTimestamp
	}
	want, err := Sign(secret, id, ts, body)
	if err != nil {
		return err
	}
	for _, s := range strings.Fields(sigs) {
		if hmac.Equal([]byte(s), []byte(want)) {
			return nil
		}
	}
	return ErrMismatch
}
