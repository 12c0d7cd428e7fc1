-- +goose Up
-- The operator console (internal/console). A session is what a login with
-- an admin API key gives: only the SHA-256 of its random token is kept, so
-- a copy of this table opens no session. Expired rows are deleted at the
-- next login.
CREATE TABLE console_sessions (
    token_hash   bytea       PRIMARY KEY,
    api_key_id   uuid        NOT NULL REFERENCES api_keys (id),
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);
CREATE INDEX console_sessions_expires_idx ON console_sessions (expires_at);

-- Every action taken from the console: who (the API key's id and name, as
-- they were), when, what, on which rows or filter, and how many rows it
-- changed. Never updated nor deleted by the console.
CREATE TABLE console_actions (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    api_key_id   uuid        NOT NULL,
    api_key_name text        NOT NULL,
    at           timestamptz NOT NULL DEFAULT now(),
    action       text        NOT NULL,
    target       jsonb       NOT NULL,
    result_count bigint      NOT NULL,
    error        text        NOT NULL DEFAULT ''
);

-- The console's overview counts dead webhook deliveries on every refresh:
-- without this, counting them reads every settled delivery (the index of
-- pending ones does not cover them). Dead ones are few; the index is small.
CREATE INDEX webhook_deliveries_dead_idx ON webhook_deliveries (id) WHERE status = 'dead';

-- +goose Down
DROP INDEX webhook_deliveries_dead_idx;
DROP TABLE console_actions;
DROP TABLE console_sessions;
