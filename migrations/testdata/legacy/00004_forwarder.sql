-- +goose Up
-- The forwarder's state. Rows of the outbox are spread over a fixed number of
-- partitions by a hash of their aggregate id; each partition is leased to one
-- forwarder instance at a time, which is what keeps one aggregate's events in
-- order however many instances run.
CREATE TABLE outbox_partitions (
    partition       integer     PRIMARY KEY,
    owner           text,
    lease_until     timestamptz,
    -- Rows this partition has forwarded since it was created: the sum over
    -- partitions is the published_total of `outflow stats`, which survives
    -- the purge of published rows.
    published_total bigint      NOT NULL DEFAULT 0
);

-- Live forwarder instances: each partition's fair share is computed from it.
CREATE TABLE outbox_forwarders (
    id           text        PRIMARY KEY,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

-- Rows waiting for a retry or parked: the claim skips an aggregate's later
-- rows while an earlier one is here. A row enters this index only when it
-- fails, so it costs nothing on the write path.
CREATE INDEX outbox_blocked_idx ON outbox (aggregate_type, aggregate_id, id)
    WHERE published_at IS NULL AND (parked_at IS NOT NULL OR next_attempt_at IS NOT NULL);

-- Wakes the forwarders listening on this schema's channel as soon as rows
-- commit. Once per statement, and PostgreSQL folds a transaction's identical
-- notifications into one.
-- +goose StatementBegin
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outflow_outbox:' || TG_TABLE_SCHEMA, '');
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- +goose Down
DROP TRIGGER outbox_notify ON outbox;
DROP FUNCTION outbox_notify();
DROP INDEX outbox_blocked_idx;
DROP TABLE outbox_forwarders;
DROP TABLE outbox_partitions;
