-- +goose NO TRANSACTION
-- +goose Up
-- The broker audit in WAL mode (issue 23): the relay keeps a receipt of
-- where the broker put each event, as the forwarder does in
-- outbox_receipts, keyed by the event's row in outbox_wal_history, from
-- which a repair publishes it again.
--
-- Online, and each statement on its own (NO TRANSACTION; each can run
-- again): history rows get an id from a sequence, the column added
-- without a default first (a moment's lock, no rewrite; rows written
-- before have none and are not audited), then the default, which only new
-- rows take. The index leaves those rows out, so building it reads the
-- history but writes nothing for it; while it builds it holds back the
-- relay's history inserts (never a producer, never a replay).
CREATE SEQUENCE IF NOT EXISTS outbox_wal_history_id_seq;
ALTER TABLE outbox_wal_history ADD COLUMN IF NOT EXISTS id bigint;
ALTER TABLE outbox_wal_history ALTER COLUMN id SET DEFAULT nextval('outbox_wal_history_id_seq');
CREATE INDEX IF NOT EXISTS outbox_wal_history_id_idx ON outbox_wal_history (id) WHERE id IS NOT NULL;
-- An event whose discard marker went out instead of it: a repair publishes
-- the marker again, not the event.
ALTER TABLE outbox_wal_history ADD COLUMN IF NOT EXISTS discarded_at timestamptz;
-- A parked event's place in its transaction: with commit_lsn, the order in
-- which its aggregate's parked events go out, whenever each was parked (a
-- repaired event is parked after its aggregate's later ones may be).
ALTER TABLE outbox_wal_parked ADD COLUMN IF NOT EXISTS position integer;

-- One row per relay batch (at most 1,000 receipts a row): the history
-- rows the broker acknowledged, where it put each (broker topic,
-- position). Written before the slot moves past them; deleted once the
-- audit judged them (settled, or lost and put back in outbox_wal_parked).
CREATE TABLE IF NOT EXISTS outbox_wal_receipts (
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
CREATE TABLE IF NOT EXISTS outbox_wal_audit (LIKE outbox_audit INCLUDING ALL);

-- +goose Down
DROP TABLE IF EXISTS outbox_wal_audit;
DROP TABLE IF EXISTS outbox_wal_receipts;
ALTER TABLE outbox_wal_parked DROP COLUMN IF EXISTS position;
ALTER TABLE outbox_wal_history DROP COLUMN IF EXISTS discarded_at;
ALTER TABLE outbox_wal_history DROP COLUMN IF EXISTS id;
DROP SEQUENCE IF EXISTS outbox_wal_history_id_seq;
