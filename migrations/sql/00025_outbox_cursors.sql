-- +goose Up
-- The forwarder stops writing to the outbox row it publishes (issue 23): a
-- row is published once the cursor of its partition is past it, not when a
-- per-row mark says so. An event costs its INSERT and nothing after it on
-- the normal path: no UPDATE, no dead tuple, no index churn.
--
-- published_through: every committed row of the partition with an id at or
-- below it was published, or is in outbox_failures. published_high: so was
-- every row at or below it, but those of the transactions in
-- waiting_xids, which were in progress when the forwarder read past their
-- ids (their rows are read once they commit). The forwarder that holds the
-- partition records the three at its lease ticks; published_through_at is
-- when it last moved them.
ALTER TABLE outbox_partitions
    ADD COLUMN published_through    bigint      NOT NULL DEFAULT 0,
    ADD COLUMN published_high       bigint      NOT NULL DEFAULT 0,
    ADD COLUMN waiting_xids         xid8[]      NOT NULL DEFAULT '{}',
    ADD COLUMN published_through_at timestamptz;

-- Which lease partitions a row maps to, by id: rows from first_id on (up
-- to the next set's first_id) are spread by a hash of their aggregate id
-- over the partitions base .. base + count - 1 (rows below the oldest set's
-- first_id map to it). One set normally; two while the partition count
-- changes with the forwarders running (forwarder.RepartitionOnline): the
-- new set's partitions publish nothing until every row of the old one is
-- published, so an aggregate's order holds across the change.
CREATE TABLE outbox_partition_sets (
    first_id   bigint      PRIMARY KEY,
    base       integer     NOT NULL CHECK (base >= 0),
    count      integer     NOT NULL CHECK (count BETWEEN 1 AND 4096),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO outbox_partition_sets (first_id, base, count)
SELECT 0, 0, count(*) FROM outbox_partitions HAVING count(*) > 0;

-- The lease partition of an outbox row, by its id and aggregate id: the one
-- rule for the tools (the view below, the journey, replay, the stats); the
-- claim writes it out for the active set. NULL before any forwarder ran.
-- +goose StatementBegin
CREATE FUNCTION outbox_partition_of(p_id bigint, p_aggregate_id text) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT s.base + ((hashtextextended(p_aggregate_id, 0) % s.count) + s.count) % s.count
    FROM outbox_partition_sets s
    WHERE s.first_id <= greatest(p_id, (SELECT min(first_id) FROM outbox_partition_sets))
    ORDER BY s.first_id DESC LIMIT 1
$$;
-- +goose StatementEnd

-- The rows off the normal path, and only they, have per-row state here:
--   failed: the broker refused it (attempts, last_error, next_attempt_at,
--           parked_at once MaxAttempts were spent);
--   held:   an earlier row of its aggregate is here; it waits behind it,
--           untried;
--   repair: the broker lost it after acknowledging it (the broker audit);
--           it is published again.
-- A row leaves the table once published; discarded_at marks a row whose
-- event an operator gave up on (its discard marker is published instead).
CREATE TABLE outbox_failures (
    id              bigint      PRIMARY KEY,
    aggregate_type  text        NOT NULL,
    aggregate_id    text        NOT NULL,
    kind            text        NOT NULL CHECK (kind IN ('failed', 'held', 'repair')),
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at timestamptz,
    parked_at       timestamptz,
    discarded_at    timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_failures_aggregate_idx ON outbox_failures (aggregate_type, aggregate_id, id);

-- The rows a forwarder of before this migration left off the normal path.
INSERT INTO outbox_failures (id, aggregate_type, aggregate_id, kind, attempts, last_error, next_attempt_at, parked_at, discarded_at)
SELECT id, aggregate_type, aggregate_id,
       CASE WHEN parked_at IS NULL AND next_attempt_at IS NOT NULL AND attempts = 0 THEN 'held' ELSE 'failed' END,
       attempts, last_error, next_attempt_at, parked_at, discarded_at
FROM outbox WHERE published_at IS NULL AND (parked_at IS NOT NULL OR next_attempt_at IS NOT NULL);

-- Each partition's cursor just below its first row never tried (a row
-- published above it is published again once: consumers drop the
-- duplicate), or at the newest row when there is none.
UPDATE outbox_partitions p SET published_through_at = now(), published_through = coalesce(
    (SELECT min(o.id) - 1 FROM outbox o
     WHERE o.published_at IS NULL AND o.parked_at IS NULL AND o.next_attempt_at IS NULL
       AND ((hashtextextended(o.aggregate_id, 0) % n.n) + n.n) % n.n = p.partition),
    (SELECT coalesce(max(id), 0) FROM outbox))
FROM (SELECT count(*) AS n FROM outbox_partitions) n;
UPDATE outbox_partitions SET published_high = published_through;

-- The claim reads the outbox by id from the cursors (the primary key); the
-- indexes on forwarder state go. The journey and replay by aggregate keep
-- an index on every row: published is no row state any more.
DROP INDEX outbox_pending_idx;
DROP INDEX outbox_blocked_idx;
DROP INDEX outbox_aggregate_version_idx;
CREATE INDEX outbox_aggregate_version_idx ON outbox (aggregate_type, aggregate_id, aggregate_version, id);

-- A row's state as the forwarder sees it, for the tools and the tests:
-- published (its partition's cursor is past it and it is not in
-- outbox_failures), pending, failed, held, repair or parked. A row the
-- holder of its partition published since its last lease tick still reads
-- pending for that long.
CREATE VIEW outbox_state AS
SELECT o.id, st.state, st.state = 'published' AS published,
       CASE WHEN st.state = 'published' THEN p.published_through_at END AS published_by,
       coalesce(f.attempts, 0) AS attempts, f.last_error, f.next_attempt_at, f.parked_at,
       coalesce(f.discarded_at, o.discarded_at) AS discarded_at
FROM outbox o
LEFT JOIN outbox_partitions p ON p.partition = outbox_partition_of(o.id, o.aggregate_id)
LEFT JOIN outbox_failures f ON f.id = o.id
CROSS JOIN LATERAL (SELECT CASE
    WHEN f.parked_at IS NOT NULL THEN 'parked'
    WHEN f.id IS NOT NULL THEN f.kind
    WHEN o.id <= p.published_through OR (o.id <= p.published_high AND o.transaction_id <> ALL(p.waiting_xids)) THEN 'published'
    ELSE 'pending' END AS state) st;

-- +goose Down
-- Rows the cursors passed are marked published; the failures go back on
-- their rows.
UPDATE outbox o SET published_at = coalesce(s.published_by, now())
FROM outbox_state s WHERE s.id = o.id AND s.published AND o.published_at IS NULL;
UPDATE outbox o SET attempts = f.attempts, last_error = f.last_error,
       next_attempt_at = coalesce(f.next_attempt_at, CASE WHEN f.parked_at IS NULL THEN now() END),
       parked_at = f.parked_at, discarded_at = f.discarded_at
FROM outbox_failures f WHERE f.id = o.id;
DROP VIEW outbox_state;
DROP INDEX outbox_aggregate_version_idx;
CREATE INDEX outbox_aggregate_version_idx ON outbox (aggregate_type, aggregate_id, aggregate_version, id)
    WHERE published_at IS NOT NULL;
CREATE INDEX outbox_blocked_idx ON outbox (aggregate_type, aggregate_id, id)
    WHERE published_at IS NULL AND (parked_at IS NOT NULL OR next_attempt_at IS NOT NULL);
CREATE INDEX outbox_pending_idx ON outbox (id) WHERE published_at IS NULL;
DROP TABLE outbox_failures;
DROP FUNCTION outbox_partition_of(bigint, text);
DROP TABLE outbox_partition_sets;
ALTER TABLE outbox_partitions DROP COLUMN published_through_at, DROP COLUMN waiting_xids, DROP COLUMN published_high,
    DROP COLUMN published_through;
