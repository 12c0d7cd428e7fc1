-- +goose Up
-- The transactional outbox. Rows are inserted in the business transaction
-- (events/outbox) and moved to the broker by the forwarder.
CREATE TABLE outbox (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id        uuid        NOT NULL UNIQUE,
    topic             text        NOT NULL,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL CHECK (aggregate_version >= 1),
    event_type        text        NOT NULL,
    payload           jsonb       NOT NULL,
    -- Envelope fields without a column of their own (correlation_id,
    -- traceparent, user metadata); the columns are not repeated here.
    metadata          jsonb       NOT NULL DEFAULT '{}',
    occurred_at       timestamptz NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    -- The writing transaction's id: lets the forwarder tell rows that cannot
    -- be committed yet (above the snapshot's xmin) from rows that never will.
    transaction_id    xid8        NOT NULL DEFAULT pg_current_xact_id(),
    -- Forwarder state.
    published_at      timestamptz,
    attempts          integer     NOT NULL DEFAULT 0,
    last_error        text,
    next_attempt_at   timestamptz,
    parked_at         timestamptz
);
-- No unique (aggregate_type, aggregate_id, aggregate_version): the producer's
-- lock on the aggregate row already makes versions gapless and unique, and
-- the extra index cost ~5% of the pay command's latency (docs/benchmarks.md).

-- The forwarder only ever looks at pending rows; the partial index stays
-- small however many published rows are kept for retention.
CREATE INDEX outbox_pending_idx ON outbox (id) WHERE published_at IS NULL;

-- +goose Down
DROP TABLE outbox;
