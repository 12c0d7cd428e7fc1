-- +goose Up
-- The forwarder's claim starts above a low-water mark instead of walking the
-- pending-rows index from its head (see the forwarder package doc). The mark
-- may pass an id only once every transaction that could still commit a row
-- with that id has ended, and the forwarder learns that from transaction ids:
-- a transaction holding an id must have had its transaction id assigned
-- BEFORE it drew the id. An identity column draws first (column defaults run
-- in column order, and nextval alone does not assign a transaction id), so
-- the id becomes a plain sequence default that asks for the transaction id
-- first. The values continue where the identity left them. CACHE 1 (the
-- default) matters: a cached sequence hands out values out of order.
-- +goose StatementBegin
DO $$
DECLARE
    last bigint := pg_sequence_last_value(pg_get_serial_sequence('outbox', 'id')::regclass);
BEGIN
    ALTER TABLE outbox ALTER COLUMN id DROP IDENTITY;
    CREATE SEQUENCE outbox_id_seq CACHE 1 OWNED BY outbox.id;
    IF last IS NOT NULL THEN
        PERFORM setval('outbox_id_seq', last);
    END IF;
END
$$;
-- +goose StatementEnd
-- CASE evaluates its condition first: pg_current_xact_id() assigns the
-- transaction id, then nextval draws the row's id.
ALTER TABLE outbox ALTER COLUMN id
    SET DEFAULT (CASE WHEN pg_current_xact_id() IS NOT NULL THEN nextval('outbox_id_seq') END);

-- +goose Down
-- +goose StatementBegin
DO $$
DECLARE
    last bigint := pg_sequence_last_value('outbox_id_seq');
BEGIN
    ALTER TABLE outbox ALTER COLUMN id DROP DEFAULT;
    DROP SEQUENCE outbox_id_seq;
    ALTER TABLE outbox ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY;
    IF last IS NOT NULL THEN
        PERFORM setval(pg_get_serial_sequence('outbox', 'id')::regclass, last);
    END IF;
END
$$;
-- +goose StatementEnd
