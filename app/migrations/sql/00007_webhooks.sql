-- +goose Up
-- NotifyMerchant's own outbox: the consumer writes one delivery per event in
-- its transaction (exactly once); the sender performs the HTTP call later,
-- outside any transaction, and records every attempt.
CREATE TABLE webhook_deliveries (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id      uuid        NOT NULL UNIQUE,
    merchant_id     uuid        NOT NULL,
    url             text        NOT NULL,
    event_type      text        NOT NULL,
    body            bytea       NOT NULL,
    status          text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';

CREATE TABLE webhook_attempts (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id  bigint      NOT NULL REFERENCES webhook_deliveries (id),
    attempted_at timestamptz NOT NULL DEFAULT now(),
    status_code  integer,
    latency_ms   double precision NOT NULL,
    error        text
);
CREATE INDEX webhook_attempts_delivery_idx ON webhook_attempts (delivery_id);

-- +goose Down
DROP TABLE webhook_attempts;
DROP TABLE webhook_deliveries;
