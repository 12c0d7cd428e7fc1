-- +goose Up
-- consumer_aggregate_versions is now the consumers' only bookkeeping
-- (package idempotency): a message at an aggregate's stored version is a
-- duplicate, one below it stale, so processed_messages is no longer written
-- nor read to decide anything (idempotency.Retention truncates it whole
-- once its newest row is past the retention). Every handled event updates
-- its aggregate's row in place, changing no indexed column: with room left
-- on the row's page the update is HOT (heap-only, no index entry) and its
-- WAL a fraction of an insert's. A fillfactor of 70 leaves that room in the
-- pages written from now on; existing pages are not rewritten (a VACUUM
-- FULL or pg_repack would, if wanted, off-peak).
--
-- SET (fillfactor) and COMMENT take a SHARE UPDATE EXCLUSIVE lock, which
-- blocks neither reads nor writes: consumers of this release and of the
-- one before (both decide by the version rows) keep running through it. It
-- touches no row.
ALTER TABLE consumer_aggregate_versions SET (fillfactor = 70);
COMMENT ON TABLE processed_messages IS
    'Not written since migration 00026''s release: consumers decide by consumer_aggregate_versions; truncated by idempotency.Retention once its newest row is past the retention.';

-- +goose Down
COMMENT ON TABLE processed_messages IS NULL;
ALTER TABLE consumer_aggregate_versions RESET (fillfactor);
