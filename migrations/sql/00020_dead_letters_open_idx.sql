-- +goose Up
-- Open dead letters (retrying, dead, held) in id order, by consumer and
-- status, and by status alone. The first answers the per-(consumer, status)
-- counts of `outflow stats` and of the console's overview
-- (idempotency.ReadParkedCounts) from the index alone, where
-- dead_letters_open_idx, whose key has no status, visits the row of each;
-- both serve the keyset lists of open dead letters (`outflow dlq list`, the
-- console's /dead): one ordered scan per status, merged, rather than a sort
-- of every open row for each page. Partial like dead_letters_open_idx: a
-- resolved or discarded row leaves them, so they stay the size of what
-- waits, and the consumers' write path, which writes dead letters rarely,
-- pays for them only then.
--
-- Not CONCURRENTLY, although a plain CREATE INDEX holds off writes to
-- dead_letters while it reads the table: a concurrent build waits for every
-- transaction of the database older than its own to end, and instances
-- that start together wait for the migration lock (migrations/lock.go) in
-- such a transaction, which waits for the build in turn: PostgreSQL
-- detects the deadlock and fails their start. The tests' parallel schemas,
-- in one database, would also wait on each other's transactions. The build
-- reads dead_letters once (100,000 rows: under a second) and writes only
-- its open rows.
CREATE INDEX dead_letters_open_consumer_status_idx ON dead_letters (consumer, status, id)
    WHERE status IN ('retrying', 'dead', 'held');
CREATE INDEX dead_letters_open_status_idx ON dead_letters (status, id)
    WHERE status IN ('retrying', 'dead', 'held');

-- +goose Down
DROP INDEX dead_letters_open_status_idx;
DROP INDEX dead_letters_open_consumer_status_idx;
