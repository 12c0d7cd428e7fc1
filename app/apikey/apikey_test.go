package apikey_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app/apikey"
	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

func TestValidateName(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		ok   bool
	}{
		{"", true},
		{"checkout", true},
		{"  padded  ", true},
		{strings.Repeat("é", apikey.MaxNameLen), true},
		{strings.Repeat("n", apikey.MaxNameLen+1), false},
		{"tab\there", false},
		{"nul\x00", false},
		{"bad \xff utf-8", false},
	} {
		err := apikey.ValidateName(tt.name)
		require.Equal(t, tt.ok, err == nil, "%q: %v", tt.name, err)
		if err != nil {
			require.ErrorIs(t, err, apikey.ErrInvalidName)
		}
	}
}

func TestKeyLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)

	admin, err := apikey.Create(ctx, s.Pool, apikey.New{Name: " ops "})
	require.NoError(t, err)
	require.True(t, admin.Admin())
	require.Equal(t, "ops", admin.Name)
	require.Regexp(t, `^ofk_[A-Za-z0-9_-]{43}$`, admin.Secret)
	require.True(t, strings.HasPrefix(admin.Secret, admin.Prefix))
	require.Len(t, admin.Prefix, 12)

	// Only the hash is stored.
	var stored int
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT count(*) FROM api_keys
		WHERE position(convert_to($1, 'UTF8') IN key_hash) > 0 OR prefix = $1 OR name = $1`, admin.Secret).Scan(&stored))
	require.Zero(t, stored)

	k, ok, err := apikey.Authenticate(ctx, s.Pool, admin.Secret)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, admin.ID, k.ID)
	require.Nil(t, k.LastUsedAt)
	for _, bad := range []string{"", "ofk_", admin.Secret + "x", admin.Secret[:len(admin.Secret)-1], strings.ToUpper(admin.Secret), "Bearer " + admin.Secret} {
		_, ok, err := apikey.Authenticate(ctx, s.Pool, bad)
		require.NoError(t, err)
		require.False(t, ok, "%q", bad)
	}

	require.NoError(t, apikey.Touch(ctx, s.Pool, k))
	k, _, err = apikey.Authenticate(ctx, s.Pool, admin.Secret)
	require.NoError(t, err)
	require.NotNil(t, k.LastUsedAt)

	_, err = apikey.Create(ctx, s.Pool, apikey.New{MerchantID: uuid.NewString()})
	require.ErrorIs(t, err, apikey.ErrUnknownMerchant)
	_, err = apikey.Create(ctx, s.Pool, apikey.New{Name: "a\nb"})
	require.ErrorIs(t, err, apikey.ErrInvalidName)

	revoked, err := apikey.Revoke(ctx, s.Pool, admin.ID)
	require.NoError(t, err)
	require.NotNil(t, revoked.RevokedAt)
	again, err := apikey.Revoke(ctx, s.Pool, admin.ID)
	require.NoError(t, err)
	require.Equal(t, revoked.RevokedAt, again.RevokedAt, "revoking twice keeps the first time")
	_, ok, err = apikey.Authenticate(ctx, s.Pool, admin.Secret)
	require.NoError(t, err)
	require.False(t, ok, "a revoked key authenticates nothing")
	_, err = apikey.Revoke(ctx, s.Pool, uuid.NewString())
	require.ErrorIs(t, err, apikey.ErrNotFound)

	keys, err := apikey.List(ctx, s.Pool)
	require.NoError(t, err)
	require.Len(t, keys, 1)
	require.Equal(t, admin.ID, keys[0].ID)
}

// PrefixOf is the prefix a created key is listed by, and nothing for what
// is not shaped like a key.
func TestPrefixOf(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	k, err := apikey.Create(context.Background(), s.Pool, apikey.New{Name: "ops"})
	require.NoError(t, err)
	require.Equal(t, k.Prefix, apikey.PrefixOf(k.Secret))
	for secret, want := range map[string]string{
		"ofk_abcdefgh": "ofk_abcdefgh", "ofk_abcdefghijk": "ofk_abcdefgh", "ofk_abcdefg": "", "": "", "OFK_abcdefghijk": "",
		"xyz_abcdefghijk": "",
	} {
		require.Equal(t, want, apikey.PrefixOf(secret), secret)
	}
}
