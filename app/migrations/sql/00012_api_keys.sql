-- +goose Up
-- API keys of the HTTP API. A key is shown once, when created; only its
-- SHA-256 is kept (the keys are 256 random bits, so a fast hash is enough:
-- no dictionary or brute force reaches them). prefix is its first
-- characters, for people to tell keys apart in `outflow apikey list`.
-- merchant_id NULL is an admin key. Keys are revoked, never deleted, so that
-- what they did stays attributable.
CREATE TABLE api_keys (
    id           uuid        PRIMARY KEY,
    prefix       text        NOT NULL,
    key_hash     bytea       NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    name         text        NOT NULL DEFAULT '' CHECK (length(name) <= 200),
    merchant_id  uuid        REFERENCES merchants (id),
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz,
    last_used_at timestamptz
);
CREATE INDEX api_keys_merchant_idx ON api_keys (merchant_id);

-- An Idempotency-Key belongs to the API key that sent it: the same value
-- from two API keys names two requests.
--
-- Rows stored before this migration were sent without any API key, and no
-- request can come without one from now on, so none of them can be
-- replayed again. They are kept (every row survives an upgrade), owned by
-- a placeholder key that is revoked from the start and whose hash has no
-- known preimage, and the key expiry deletes them with their TTL as usual.
-- The placeholder exists only where such rows did.
INSERT INTO api_keys (id, prefix, key_hash, name, created_at, revoked_at)
SELECT gen_random_uuid(), 'legacy', sha256(convert_to(gen_random_uuid()::text || clock_timestamp()::text, 'UTF8')),
       'owner of the Idempotency-Keys stored before API keys', now(), now()
WHERE EXISTS (SELECT 1 FROM idempotency_keys);

ALTER TABLE idempotency_keys ADD COLUMN api_key_id uuid REFERENCES api_keys (id);
UPDATE idempotency_keys SET api_key_id = (SELECT id FROM api_keys WHERE prefix = 'legacy');
ALTER TABLE idempotency_keys ALTER COLUMN api_key_id SET NOT NULL;
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey;
ALTER TABLE idempotency_keys ADD PRIMARY KEY (api_key_id, key);

-- +goose Down
-- Without the owner, one value may name several rows: keep the newest.
DELETE FROM idempotency_keys a USING idempotency_keys b
WHERE a.key = b.key AND (a.created_at, a.api_key_id) < (b.created_at, b.api_key_id);
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey;
ALTER TABLE idempotency_keys DROP COLUMN api_key_id;
ALTER TABLE idempotency_keys ADD PRIMARY KEY (key);
DROP TABLE api_keys;
