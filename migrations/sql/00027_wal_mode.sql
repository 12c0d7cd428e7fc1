-- +goose Up
-- The WAL mode (events/outbox ModeWAL, package walrelay): events travel as
-- logical decoding messages, not rows, so the outbox table stays empty.
-- These tables hold what the relay must keep across restarts.

-- The replication slots a relay created (or adopted), so that a slot that
-- vanished (dropped by hand, or lost with a failover that did not carry
-- it) is told from one never made: the relay refuses to create a recorded
-- slot again silently, and `outflow relay recover-slot` records here the
-- range of WAL whose events were never read.
CREATE TABLE outbox_wal_slots (
    slot_name     text        PRIMARY KEY,
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- The last position the relay confirmed: where a loss starts.
    confirmed_lsn pg_lsn,
    confirmed_at  timestamptz,
    -- Set by recover-slot: the lost range [lost_from, lost_to) and when.
    lost_from     pg_lsn,
    lost_to       pg_lsn,
    lost_status   text,
    recovered_at  timestamptz
);

-- Events the broker refused, and the later events of their aggregates held
-- behind them, copied here before the slot moves past them. The relay
-- retries the head of each aggregate on the forwarder's schedule; after
-- MaxAttempts it is parked (parked_at) until an operator retries or
-- discards it, as in table mode. Rows are deleted once published.
CREATE TABLE outbox_wal_parked (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id        uuid        NOT NULL UNIQUE,
    topic             text        NOT NULL,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL,
    event_type        text        NOT NULL,
    -- json, not jsonb: the payload's text as the writer emitted it, so a
    -- retry publishes the very bytes first offered.
    payload           json        NOT NULL,
    metadata          jsonb       NOT NULL DEFAULT '{}',
    occurred_at       timestamptz NOT NULL,
    commit_lsn        pg_lsn      NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    attempts          integer     NOT NULL DEFAULT 0,
    last_error        text,
    next_attempt_at   timestamptz,
    parked_at         timestamptz,
    discarded_at      timestamptz
);
CREATE INDEX outbox_wal_parked_aggregate_idx ON outbox_wal_parked (aggregate_type, aggregate_id, id);

-- Every event the relay published, for replay and repair: insert-only,
-- partitioned by day of recorded_at, a day's partition dropped whole once
-- past retention (15 days by default), so the history costs no update, no
-- delete and no vacuum. The relay creates the partitions it writes to.
-- An event read twice (a relay killed before it confirmed the slot) may be
-- recorded twice: a replay deduplicates by message_id, as consumers do.
CREATE TABLE outbox_wal_history (
    recorded_at       timestamptz NOT NULL DEFAULT now(),
    commit_lsn        pg_lsn      NOT NULL,
    -- The event's place in its transaction: (commit_lsn, position) is
    -- the order it was committed and published in.
    position          integer     NOT NULL,
    message_id        uuid        NOT NULL,
    topic             text        NOT NULL,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL,
    event_type        text        NOT NULL,
    -- json: the very text published, for a replay byte for byte.
    payload           json        NOT NULL,
    metadata          jsonb       NOT NULL DEFAULT '{}',
    occurred_at       timestamptz NOT NULL
) PARTITION BY RANGE (recorded_at);
CREATE INDEX outbox_wal_history_lsn_idx ON outbox_wal_history (commit_lsn, position);

-- +goose Down
DROP TABLE outbox_wal_history;
DROP TABLE outbox_wal_parked;
DROP TABLE outbox_wal_slots;
