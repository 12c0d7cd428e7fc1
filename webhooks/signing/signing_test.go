package signing_test

import (
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/outflow-dev/outflow/webhooks/signing"
)

// The Standard Webhooks specification's own test vector.
func TestSignKnownVector(t *testing.T) {
	t.Parallel()
	got, err := signing.Sign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330",
		[]byte(`{"test": 2432232314}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
}

func TestVerify(t *testing.T) {
	t.Parallel()
	cur, _ := signing.NewSecret()
	old, _ := signing.NewSecret()
	other, _ := signing.NewSecret()
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"type":"payment.paid"}`)
	headers := func(ts time.Time, secrets ...string) http.Header {
		sig, err := signing.Header(secrets, "msg_1", strconv.FormatInt(ts.Unix(), 10), body)
		if err != nil {
			t.Fatal(err)
		}
		h := http.Header{}
		h.Set(signing.HeaderID, "msg_1")
		h.Set(signing.HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
		h.Set(signing.HeaderSignature, sig)
		return h
	}
	tests := []struct {
		name   string
		secret string
		h      http.Header
		want   error
	}{
		{"current secret", cur, headers(now, cur), nil},
		{"rotated: receiver still on the old secret", old, headers(now, cur, old), nil},
		{"rotated: receiver already on the new one", cur, headers(now, cur, old), nil},
		{"another secret", other, headers(now, cur, old), signing.ErrMismatch},
		{"too old", cur, headers(now.Add(-6*time.Minute), cur), signing.ErrTimestamp},
		{"from the future", cur, headers(now.Add(6*time.Minute), cur), signing.ErrTimestamp},
		{"no headers", cur, http.Header{}, signing.ErrNoSignature},
		{"bad secret", "whsec_!!", headers(now, cur), signing.ErrBadSecret},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := signing.Verify(tt.secret, tt.h, body, now, 0); !errors.Is(err, tt.want) {
				t.Fatalf("Verify = %v, want %v", err, tt.want)
			}
		})
	}
}
