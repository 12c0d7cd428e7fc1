package secretseal_test

import (
	"fmt"
	"strings"

	"github.com/outflow-dev/outflow/webhooks/secretseal"
)

func ExampleOpen() {
	// In production: os.Getenv(secretseal.KeyEnv), from `openssl rand -base64 32`.
	key, err := secretseal.ParseKey("AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=")
	if err != nil {
		panic(err)
	}
	const merchant = "0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60"
	stored, _ := key.Seal("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", merchant)
	fmt.Println(strings.HasPrefix(stored, "enc:v1:"+key.ID()+":"))

	secret, _ := secretseal.Open(key, stored, merchant)
	fmt.Println(secret)

	_, err = secretseal.Open(key, stored, "another merchant")
	fmt.Println(err)
	// Output:
	// true
	// whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
	// open webhook secret: authentication failed (altered, or not this merchant's): does not open with OUTFLOW_SECRET_KEY
}
