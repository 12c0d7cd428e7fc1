-- +goose Up
-- Large bodies by reference (issue 26, the claim check of events/claimcheck):
-- an event whose payload is at least the writer's threshold keeps its body
-- here, written in the business transaction with the outbox row, which
-- carries only a reference (message id, sha256, size in its metadata).
-- The broker never sees the body; a consumer fetches it by message id.
--
-- bytea, not jsonb: the very bytes the writer encoded, which the sha256 in
-- the reference is of (jsonb would reformat them).
--
-- Partitioned by day of created_at (the writing transaction's start, as
-- the outbox row's created_at), so that retention drops a day whole once
-- its events are gone: deleting a body row by row would write its TOAST
-- pages to the WAL again as full-page images, as much WAL as the body
-- itself (docs/benchmarks.md). The forwarder's and the WAL relay's purges
-- create today's and tomorrow's (claimcheck.EnsurePartitions) at each run;
-- a body whose day has no partition (before the first run) lands in
-- outflow_claim_bodies_default, purged row by row. message_id is not unique across days (a unique index must hold the
-- partition key): each event has one body, written with it.
--
-- Online: a new table, empty.
CREATE TABLE outflow_claim_bodies (
    message_id uuid        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    sha256     bytea       NOT NULL CHECK (length(sha256) = 32),
    size       integer     NOT NULL CHECK (size >= 0),
    body       bytea       NOT NULL
) PARTITION BY RANGE (created_at);
CREATE INDEX outflow_claim_bodies_message_id_idx ON outflow_claim_bodies (message_id);
CREATE TABLE outflow_claim_bodies_default PARTITION OF outflow_claim_bodies DEFAULT;

REVOKE ALL ON outflow_claim_bodies FROM PUBLIC;

-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outflow_claim_reader') THEN
        BEGIN
            CREATE ROLE outflow_claim_reader NOLOGIN;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN NULL; -- created meanwhile by another schema's migration
            WHEN insufficient_privilege THEN
                RAISE NOTICE 'outflow: role outflow_claim_reader not created (no CREATEROLE): bodies by reference are readable by the table''s owner only until an administrator creates it and grants SELECT ON outflow_claim_bodies to it';
        END;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outflow_claim_reader') THEN
        GRANT SELECT ON outflow_claim_bodies TO outflow_claim_reader;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The role stays: it is shared by every schema and database of the cluster.
DROP TABLE outflow_claim_bodies;
