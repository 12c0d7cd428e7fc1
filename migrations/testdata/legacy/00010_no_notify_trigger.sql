-- +goose Up
-- No NOTIFY in a producer's transaction. A transaction that has queued a
-- notification takes an instance-wide lock at commit (so that notifications
-- are delivered in commit order), which serialises every notifying commit of
-- the whole PostgreSQL instance: at 16 clients the pay command lost a third
-- of its throughput to it (docs/benchmarks.md). The forwarder now finds new
-- rows by polling the pending-rows index with an adaptive interval, and is
-- woken in-process when the writer shares its process (forwarder/doc.go).
DROP TRIGGER outbox_notify ON outbox;
DROP FUNCTION outbox_notify();

-- +goose Down
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
