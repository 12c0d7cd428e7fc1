-- +goose Up
-- webhook_secret holds either the plaintext "whsec_..." (rows written
-- without OUTFLOW_SECRET_KEY) or the secret sealed with that key,
-- "enc:v1:..." (see app/secretseal). A rotation keeps the secret it
-- replaces, in the same form, valid until previous_webhook_secret_expires_at:
-- the sender signs with both until then.
ALTER TABLE merchants
    ADD COLUMN previous_webhook_secret text,
    ADD COLUMN previous_webhook_secret_expires_at timestamptz,
    ADD CONSTRAINT merchants_previous_webhook_secret_check
        CHECK ((previous_webhook_secret IS NULL) = (previous_webhook_secret_expires_at IS NULL));

-- +goose Down
ALTER TABLE merchants
    DROP CONSTRAINT merchants_previous_webhook_secret_check,
    DROP COLUMN previous_webhook_secret_expires_at,
    DROP COLUMN previous_webhook_secret;
