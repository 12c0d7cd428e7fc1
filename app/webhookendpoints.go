package app

import (
	"github.com/outflow-dev/outflow/webhooks/endpoints"
)

// WebhookEndpoints returns the store of the merchants' webhook endpoints
// (the webhook package's, account = merchant id) under the service's own
// rules for webhooks: the same URL policy as a merchant's webhook_url
// (Config.AllowPrivateWebhooks), the same key sealing the secrets at rest
// (Config.SecretKey; the store seals with the endpoint id, which is the
// merchant id for the endpoint migration 00034 made), and the same grace
// period for a rotated-out secret (Config.WebhookSecretGrace).
func (s *Service) WebhookEndpoints() (*endpoints.Store, error) {
	grace := s.secretGrace
	if grace <= 0 {
		grace = endpoints.NoGrace
	}
	return endpoints.New(endpoints.Config{SecretKey: s.secretKey, AllowPrivate: s.urlPolicy.AllowPrivate,
		SecretGrace: grace, Now: s.now})
}

// CanonicalMerchantID returns the merchant id as the service stores it
// (lower-case) for an id in any spelling the API accepts (the 36-character
// form, in any case), and false for a string that is no merchant id.
func CanonicalMerchantID(id string) (string, bool) { return canonicalID(id) }
