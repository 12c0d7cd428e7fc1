-- +goose Up
-- The broker audit in WAL mode (issue 23): the relay keeps a receipt of
-- where the broker put each event, as the forwarder does in
-- outbox_receipts, keyed by the event's row in outbox_wal_history, from
-- which a repair publishes it again.
--
-- History rows get an id (bigint, from a sequence, by default). Online:
-- the column is added without a default first (no rewrite; rows written
-- before have none and are not audited), then the default, which only new
-- rows take. The index leaves those rows out, so building it reads the
-- history but writes nothing for it; it holds back only the relay's own
-- history inserts (never a producer) while it builds.
CREATE SEQUENCE outbox_wal_history_id_seq;
ALTER TABLE outbox_wal_history ADD COLUMN id bigint;
ALTER TABLE outbox_wal_history ALTER COLUMN id SET DEFAULT nextval('outbox_wal_history_id_seq');
CREATE INDEX outbox_wal_history_id_idx ON outbox_wal_history (id) WHERE id IS NOT NULL;

-- One row per relay batch (at most 1,000 receipts a row): the history
-- rows the broker acknowledged, where it put each (broker topic,
-- position). Written before the slot moves past them; deleted once the
-- audit judged them (settled, or lost and put back in outbox_wal_parked).
CREATE TABLE outbox_wal_receipts (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    published_at  timestamptz NOT NULL DEFAULT now(),
    history_ids   bigint[]    NOT NULL,
    broker_topics text[]      NOT NULL,
    positions     text[]      NOT NULL
);

-- The auditor's state per broker topic, as outbox_audit is table mode's:
-- its own table, so that a forwarder and a relay auditing one broker topic
-- (while a service moves from one mode to the other) never hand each
-- other's state to Check.
CREATE TABLE outbox_wal_audit (LIKE outbox_audit INCLUDING ALL);

-- +goose Down
DROP TABLE outbox_wal_audit;
DROP TABLE outbox_wal_receipts;
DROP INDEX outbox_wal_history_id_idx;
ALTER TABLE outbox_wal_history DROP COLUMN id;
DROP SEQUENCE outbox_wal_history_id_seq;
