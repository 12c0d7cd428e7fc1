-- +goose Up
-- Idempotency-Key of the HTTP API: the key row is written in the same
-- transaction as the command it guards, so a key exists exactly when its
-- effect committed.
CREATE TABLE idempotency_keys (
    key           text        PRIMARY KEY,
    request_hash  bytea       NOT NULL,
    status_code   integer     NOT NULL,
    response_body bytea       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idempotency_keys_created_idx ON idempotency_keys (created_at);

-- +goose Down
DROP TABLE idempotency_keys;
