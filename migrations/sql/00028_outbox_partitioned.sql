-- +goose NO TRANSACTION
-- +goose Up
-- The outbox becomes a table partitioned by id range (issue 23): retention
-- drops a partition whole once every row in it is published and older than
-- the retention, instead of deleting rows one by one and vacuuming them.
-- An event then costs the database its INSERT and nothing after it.
--
-- Online: producers keep writing. The table as it is becomes the first
-- partition, outbox_p0, for every id below a bound B at least a million
-- ids ahead of the sequence (rounded up to ten million). A partition must be proven to hold only ids in its
-- range, so B is first a CHECK constraint added NOT VALID (a moment's lock)
-- and validated on its own (a scan under a lock that lets writes through);
-- attaching then trusts it and reads nothing. The swap itself (rename,
-- create the partitioned table, attach) takes the outbox's exclusive lock
-- for milliseconds, retried with a short lock_timeout so that it never
-- queues producers behind a long transaction for long. NO TRANSACTION: the
-- validation must not hold the swap's lock, and each step checks whether
-- it already ran, so a migration interrupted between them runs again.
--
-- A message_id is unique within a partition, not across them (a partitioned
-- table's unique index must contain the partition key): ids are UUIDv7,
-- drawn once per event. Each partition has its own primary key, unique
-- message_id and aggregate index; the partitioned table none, so that
-- attaching the old table builds nothing. outbox_default catches ids no
-- range partition takes (when the forwarders that create partitions ahead
-- have not run for a long time): producers never fail for want of a
-- partition; its rows are purged row by row.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_add_partition(lo bigint, hi bigint) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    name text := 'outbox_p' || lo;
BEGIN
    EXECUTE format('CREATE TABLE %I (LIKE outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
    EXECUTE format('ALTER TABLE %I ADD PRIMARY KEY (id), ADD UNIQUE (message_id), ADD CHECK (id >= %s AND id < %s)', name, lo, hi);
    EXECUTE format('CREATE INDEX ON %I (aggregate_type, aggregate_id, aggregate_version, id)', name);
    EXECUTE format('ALTER TABLE outbox ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)', name, lo, hi);
    RETURN name;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'outbox'::regclass) = 'r'
       AND NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = 'outbox'::regclass AND conname = 'outbox_p0_bound') THEN
        -- At least a million ids ahead, rounded up to ten million: the
        -- same layout for the same order of history.
        EXECUTE format('ALTER TABLE outbox ADD CONSTRAINT outbox_p0_bound CHECK (id < %s) NOT VALID',
                       ((coalesce(pg_sequence_last_value('outbox_id_seq'), 0) + 1000000) / 10000000 + 1) * 10000000);
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'outbox'::regclass) = 'r' THEN
        ALTER TABLE outbox VALIDATE CONSTRAINT outbox_p0_bound;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
DECLARE
    b    bigint;
    view text;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'outbox'::regclass) <> 'r' THEN
        RETURN;
    END IF;
    FOR try IN 1..60 LOOP
        BEGIN
            SET LOCAL lock_timeout = '1s';
            LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE;
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            IF try = 60 THEN
                RAISE;
            END IF;
        END;
    END LOOP;
    SET LOCAL lock_timeout = 0;
    SELECT (regexp_match(pg_get_constraintdef(oid), '(\d+)'))[1]::bigint INTO b
    FROM pg_constraint WHERE conrelid = 'outbox'::regclass AND conname = 'outbox_p0_bound';
    IF coalesce(pg_sequence_last_value('outbox_id_seq'), 0) >= b - 1000 THEN
        RAISE EXCEPTION 'outbox ids reached % while the migration ran: drop constraint outbox_p0_bound and run it again', b;
    END IF;
    view := pg_get_viewdef('outbox_state'::regclass);
    DROP VIEW outbox_state;
    ALTER TABLE outbox RENAME TO outbox_p0;
    CREATE TABLE outbox (LIKE outbox_p0 INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (id);
    ALTER TABLE outbox DROP CONSTRAINT outbox_p0_bound;
    EXECUTE format('ALTER TABLE outbox ATTACH PARTITION outbox_p0 FOR VALUES FROM (MINVALUE) TO (%s)', b);
    ALTER SEQUENCE outbox_id_seq OWNED BY outbox.id;
    CREATE TABLE outbox_default PARTITION OF outbox DEFAULT;
    ALTER TABLE outbox_default ADD PRIMARY KEY (id), ADD UNIQUE (message_id);
    CREATE INDEX ON outbox_default (aggregate_type, aggregate_id, aggregate_version, id);
    PERFORM outbox_add_partition(b, b + 10000000);
    EXECUTE 'CREATE VIEW outbox_state AS ' || view;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Back to one table: every partition's rows copied into it, under the
-- outbox's exclusive lock (not online: a rollback is for a test or an
-- emergency).
-- +goose StatementBegin
DO $$
DECLARE
    view text;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'outbox'::regclass) <> 'p' THEN
        RETURN;
    END IF;
    LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE;
    view := pg_get_viewdef('outbox_state'::regclass);
    DROP VIEW outbox_state;
    CREATE TABLE outbox_flat (LIKE outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
    INSERT INTO outbox_flat SELECT * FROM outbox;
    ALTER SEQUENCE outbox_id_seq OWNED BY outbox_flat.id;
    DROP TABLE outbox;
    ALTER TABLE outbox_flat RENAME TO outbox;
    ALTER TABLE outbox ADD CONSTRAINT outbox_pkey PRIMARY KEY (id), ADD CONSTRAINT outbox_message_id_key UNIQUE (message_id);
    CREATE INDEX outbox_aggregate_version_idx ON outbox (aggregate_type, aggregate_id, aggregate_version, id);
    EXECUTE 'CREATE VIEW outbox_state AS ' || view;
END
$$;
-- +goose StatementEnd
DROP FUNCTION outbox_add_partition(bigint, bigint);
