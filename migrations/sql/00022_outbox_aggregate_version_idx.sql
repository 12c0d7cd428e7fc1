-- +goose Up
-- An aggregate's published rows in version order: replaces 00017's
-- outbox_aggregate_idx (aggregate_type, aggregate_id), whose entries for one
-- aggregate come in no useful order. The console's journey reads one page
-- of an aggregate's events at a time, by keyset on (aggregate_version, id):
-- with the order in the key, a page is a range scan that stops after the
-- page's rows, where the old index returned every published row of the
-- aggregate to be sorted for each page (an account or a merchant has
-- thousands). id breaks ties: versions are unique per aggregate by the
-- producer's lock, not by a constraint. Replay and reset, which select
-- aggregates by (aggregate_type, aggregate_id), use its prefix as they used
-- the old index. Partial on published rows like 00017's, for the same
-- reason: the producer's INSERT adds nothing to it; the forwarder's mark
-- writes one entry, 16 bytes wider than before (docs/benchmarks.md).
-- Pending rows are still found through outbox_pending_idx.
--
-- Not CONCURRENTLY: a concurrent build deadlocks with instances waiting
-- for the migration lock (see 00020). The build reads the outbox once and
-- holds off its writes meanwhile; the old index goes in the same
-- transaction, so no moment has neither.
CREATE INDEX outbox_aggregate_version_idx ON outbox (aggregate_type, aggregate_id, aggregate_version, id)
    WHERE published_at IS NOT NULL;
DROP INDEX outbox_aggregate_idx;

-- +goose Down
CREATE INDEX outbox_aggregate_idx ON outbox (aggregate_type, aggregate_id) WHERE published_at IS NOT NULL;
DROP INDEX outbox_aggregate_version_idx;
