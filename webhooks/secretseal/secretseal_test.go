package secretseal_test

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/webhooks/secretseal"
)

func key(t *testing.T, b byte) *secretseal.Key {
	t.Helper()
	k, err := secretseal.ParseKey(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32)))
	require.NoError(t, err)
	return k
}

func TestSealOpenRoundTrip(t *testing.T) {
	t.Parallel()
	k := key(t, 1)
	const secret, owner = "whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI=", "0193e4a5-7b1c-7d2e-8f3a-1b2c3d4e5f60"
	sealed, err := k.Seal(secret, owner)
	require.NoError(t, err)
	require.True(t, secretseal.Sealed(sealed))
	require.NotContains(t, sealed, secret)
	require.NotContains(t, sealed, strings.TrimPrefix(secret, "whsec_"))
	again, err := k.Seal(secret, owner)
	require.NoError(t, err)
	require.NotEqual(t, sealed, again, "a fresh nonce each time")

	got, err := secretseal.Open(k, sealed, owner)
	require.NoError(t, err)
	require.Equal(t, secret, got)

	// Plaintext, as stored before a key was set, reads as itself.
	got, err = secretseal.Open(nil, secret, owner)
	require.NoError(t, err)
	require.Equal(t, secret, got)

	_, err = secretseal.Open(nil, sealed, owner)
	require.ErrorIs(t, err, secretseal.ErrNoKey)
	require.ErrorContains(t, err, "OUTFLOW_SECRET_KEY is not set")

	_, err = secretseal.Open(key(t, 2), sealed, owner)
	require.ErrorIs(t, err, secretseal.ErrWrongKey)
	require.ErrorContains(t, err, "sealed with key "+k.ID())

	_, err = secretseal.Open(k, sealed, "another-merchant")
	require.ErrorIs(t, err, secretseal.ErrWrongKey, "bound to its merchant")

	tampered := sealed[:len(sealed)-4] + "AAA="
	_, err = secretseal.Open(k, tampered, owner)
	require.ErrorIs(t, err, secretseal.ErrWrongKey)
	require.NotContains(t, fmt.Sprint(err), secret)
}

func TestParseKey(t *testing.T) {
	t.Parallel()
	good := bytes.Repeat([]byte{7}, 32)
	for _, tt := range []struct {
		in, wantErr string
	}{
		{base64.StdEncoding.EncodeToString(good), ""},
		{base64.RawStdEncoding.EncodeToString(good), ""},
		{" " + base64.StdEncoding.EncodeToString(good) + "\n", ""},
		{base64.StdEncoding.EncodeToString(good[:16]), "not of 16 bytes"},
		{"hunter2-not-base64!", "not valid base64"},
		{"", "not of 0 bytes"},
	} {
		_, err := secretseal.ParseKey(tt.in)
		if tt.wantErr == "" {
			require.NoError(t, err, tt.in)
			continue
		}
		require.ErrorContains(t, err, tt.wantErr, tt.in)
		require.NotContains(t, err.Error(), "hunter2")
	}
}
