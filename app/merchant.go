package app

import (
	"crypto/rand"
	"encoding/base64"
	"strings"
	"time"
	"unicode"

	"github.com/outflow-dev/outflow/internal/netguard"
)

// Merchant receives webhooks for its payments.
type Merchant struct {
	ID         string    `json:"id"`
	Name       string    `json:"name"`
	WebhookURL string    `json:"webhook_url"`
	CreatedAt  time.Time `json:"created_at"`
}

// NewMerchant is the input of CreateMerchant.
type NewMerchant struct {
	Name       string `json:"name"`
	WebhookURL string `json:"webhook_url"`
}

// CreatedMerchant is a merchant with its webhook signing secret, which is
// returned once, at creation.
type CreatedMerchant struct {
	Merchant
	WebhookSecret string `json:"webhook_secret"`
}

// Validate checks the input and names the first bad field. The webhook URL
// must be https and must not point at a private, loopback or link-local
// address (see [netguard.Policy.CheckURL]).
func (m NewMerchant) Validate() error { return m.validate(netguard.Policy{}) }

func (m NewMerchant) validate(policy netguard.Policy) error {
	if err := ValidateName("name", m.Name, 200); err != nil {
		return err
	}
	switch {
	case strings.ContainsFunc(m.WebhookURL, unicode.IsControl):
		return &ValidationError{Field: "webhook_url", Message: "must not contain control characters"}
	case m.WebhookURL == "":
		return &ValidationError{Field: "webhook_url", Message: "is required"}
	}
	if _, err := policy.CheckURL(m.WebhookURL); err != nil {
		return &ValidationError{Field: "webhook_url", Message: err.Error()}
	}
	return nil
}

// newWebhookSecret returns a Standard Webhooks secret: "whsec_" and 32
// random bytes in base64.
func newWebhookSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(b), nil
}
