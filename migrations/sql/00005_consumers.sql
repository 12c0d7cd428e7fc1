-- +goose Up
-- Consumers' bookkeeping, in the consumer's own database and written in the
-- same transaction as the handler's effects (package idempotency).

-- One row per message a consumer has processed: a redelivery finds its row
-- and changes nothing.
CREATE TABLE processed_messages (
    message_id   uuid        NOT NULL,
    consumer     text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, consumer)
);
CREATE INDEX processed_messages_processed_at_idx ON processed_messages (processed_at);

-- The last applied version of each aggregate, per consumer. prev_version is
-- the version before the last upsert, so one statement can both decide and
-- report whether a message applies.
CREATE TABLE consumer_aggregate_versions (
    consumer       text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    version        bigint      NOT NULL,
    prev_version   bigint      NOT NULL DEFAULT 0,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, aggregate_type, aggregate_id)
);

-- Messages a consumer gave up on, kept whole for an operator.
CREATE TABLE dead_letters (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer          text        NOT NULL,
    message_id        uuid        NOT NULL,
    event_type        text        NOT NULL,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL,
    payload           bytea       NOT NULL,
    metadata          jsonb       NOT NULL,
    reason            text        NOT NULL,
    error             text        NOT NULL,
    attempts          integer     NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    resolved_at       timestamptz,
    UNIQUE (consumer, message_id)
);

-- +goose Down
DROP TABLE dead_letters;
DROP TABLE consumer_aggregate_versions;
DROP TABLE processed_messages;
