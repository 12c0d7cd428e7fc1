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

-- Messages a consumer could not apply yet, kept whole. status:
--   retrying: the handler failed; tried again at next_attempt_at;
--   dead:     out of attempts: waits for an operator (outflow dlq retry |
--             discard); a gap that timed out (reason 'gap') heals by
--             itself once its predecessor applies;
--   held:     a later event of an aggregate that has an earlier row here;
--             applied, in version order, once the earlier one is;
--   resolved, discarded: done.
-- While an aggregate has a retrying, dead or held row, its later events
-- queue here, for this consumer only: other aggregates and other consumers
-- keep flowing.
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
    status            text        NOT NULL CHECK (status IN ('retrying', 'dead', 'held', 'resolved', 'discarded')),
    reason            text        NOT NULL,
    error             text        NOT NULL DEFAULT '',
    attempts          integer     NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    resolved_at       timestamptz,
    UNIQUE (consumer, message_id)
);
CREATE INDEX dead_letters_open_idx ON dead_letters (consumer, aggregate_type, aggregate_id, aggregate_version)
    WHERE status IN ('retrying', 'dead', 'held');

-- +goose Down
DROP TABLE dead_letters;
DROP TABLE consumer_aggregate_versions;
DROP TABLE processed_messages;
