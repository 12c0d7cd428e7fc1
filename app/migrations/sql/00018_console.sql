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

-- The overview's per-consumer counts (idempotency.ReadParkedCounts: held,
-- retrying, dead) read the status of every open dead letter: through
-- dead_letters_open_idx that is a heap visit per row (110 ms for 66,000 open
-- ones on a loaded 2-core machine); this index answers them from the index
-- alone (12-20 ms). dead_letters is the framework's table: the index is
-- here because the reference binary's console asks every 2 s; it could
-- move to the framework's set (`outflow stats` uses the same count). Dead
-- letters are rare, so it costs the consumers' write path nothing worth
-- measuring.
CREATE INDEX console_dead_letters_open_status_idx ON dead_letters (consumer, status)
    WHERE status IN ('retrying', 'dead', 'held');

-- +goose Down
-- IF EXISTS: rolling the framework's set back first drops dead_letters,
-- and its indexes with it.
DROP INDEX IF EXISTS console_dead_letters_open_status_idx;
DROP INDEX webhook_deliveries_dead_idx;
DROP TABLE console_actions;
DROP TABLE console_sessions;
