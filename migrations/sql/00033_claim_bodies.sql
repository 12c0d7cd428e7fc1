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
-- itself (docs/benchmarks.md). This migration creates today's partition
-- and the next days' (UTC); the forwarder's and the WAL relay's purges
-- (claimcheck.PurgeBodies) keep them several days ahead. A body whose day
-- has no partition lands in outflow_claim_bodies_default; a day the
-- default partition holds rows of never gets a partition (attaching it
-- would fail, 23514): those rows are deleted from the default partition
-- in batches once past the cutoff. message_id is not unique across days
-- (a unique index must hold the partition key): each event has one body,
-- written with it.
--
-- The partition work runs in SECURITY DEFINER functions owned by the
-- migrating role (the table's owner), search_path pinned to this schema:
-- creating, attaching and dropping a partition needs the table's
-- ownership, and the purge's check reads bodies; a forwarder or relay
-- role granted EXECUTE on them purges without either. EXECUTE is revoked
-- from PUBLIC: a caller chooses the cutoff.
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

-- outflow_claim_bodies_add_day creates and attaches the partition of day
-- (UTC) and returns its name; NULL when it exists, or when the default
-- partition holds bodies of that day. Created on its own, then attached:
-- ATTACH takes SHARE UPDATE EXCLUSIVE on the table (producers write and
-- consumers read on), and its CHECK spares the attach a scan of it.
-- +goose StatementBegin
CREATE FUNCTION outflow_claim_bodies_add_day(day date) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    name text := 'outflow_claim_bodies_' || to_char(day, 'YYYYMMDD');
    lo   timestamptz := day::timestamp AT TIME ZONE 'UTC';
    hi   timestamptz := (day + 1)::timestamp AT TIME ZONE 'UTC';
BEGIN
    IF to_regclass(name) IS NOT NULL THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM outflow_claim_bodies_default WHERE created_at >= lo AND created_at < hi) THEN
        RETURN NULL;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE outflow_claim_bodies INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
    EXECUTE format('ALTER TABLE %I ADD CHECK (created_at >= %L AND created_at < %L)', name, lo, hi);
    EXECUTE format('ALTER TABLE outflow_claim_bodies ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', name, lo, hi);
    RETURN name;
EXCEPTION WHEN check_violation THEN
    RETURN NULL; -- a body of that day reached the default partition meanwhile
END
$$;
-- +goose StatementEnd

-- outflow_claim_bodies_drop_day drops the partition of day once no body
-- in it belongs to an event still kept (in the outbox, or parked by the
-- WAL relay), and never one of a day that ended less than a day ago (a
-- transaction may still write into it). Returns whether it dropped. The
-- check runs before the drop's exclusive lock: nothing writes into a day
-- that old, and events only go.
-- +goose StatementBegin
CREATE FUNCTION outflow_claim_bodies_drop_day(day date) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    name text := 'outflow_claim_bodies_' || to_char(day, 'YYYYMMDD');
    live boolean;
BEGIN
    IF ((day + 1)::timestamp AT TIME ZONE 'UTC') > now() - interval '1 day'
       OR NOT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass(name) AND inhparent = 'outflow_claim_bodies'::regclass) THEN
        RETURN false;
    END IF;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I b WHERE EXISTS (SELECT 1 FROM outbox o WHERE o.message_id = b.message_id)
                    OR EXISTS (SELECT 1 FROM outbox_wal_parked w WHERE w.message_id = b.message_id))', name) INTO live;
    IF live THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP TABLE %I', name);
    RETURN true;
END
$$;
-- +goose StatementEnd

-- outflow_claim_bodies_purge_default deletes at most batch bodies of the
-- default partition created before cutoff (and a day ago at least) whose
-- event is gone, and returns how many.
-- +goose StatementBegin
CREATE FUNCTION outflow_claim_bodies_purge_default(cutoff timestamptz, batch integer) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n bigint;
BEGIN
    DELETE FROM outflow_claim_bodies_default WHERE ctid = ANY (ARRAY(
        SELECT b.ctid FROM outflow_claim_bodies_default b
        WHERE b.created_at < least(cutoff, now() - interval '1 day')
          AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.message_id = b.message_id)
          AND NOT EXISTS (SELECT 1 FROM outbox_wal_parked w WHERE w.message_id = b.message_id)
        LIMIT batch));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION outflow_claim_bodies_add_day(date) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION outflow_claim_bodies_drop_day(date) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION outflow_claim_bodies_purge_default(timestamptz, integer) SET search_path = %I, pg_temp', current_schema());
    PERFORM outflow_claim_bodies_add_day((now() AT TIME ZONE 'UTC')::date + d) FROM generate_series(0, 3) d;
END
$$;
-- +goose StatementEnd
REVOKE EXECUTE ON FUNCTION outflow_claim_bodies_add_day(date), outflow_claim_bodies_drop_day(date),
    outflow_claim_bodies_purge_default(timestamptz, integer) FROM PUBLIC;

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
DROP FUNCTION outflow_claim_bodies_add_day(date);
DROP FUNCTION outflow_claim_bodies_drop_day(date);
DROP FUNCTION outflow_claim_bodies_purge_default(timestamptz, integer);
DROP TABLE outflow_claim_bodies;
