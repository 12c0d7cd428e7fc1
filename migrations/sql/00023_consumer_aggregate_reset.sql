-- +goose Up
-- When `outflow consumer reset` (replay.ResetConsumer) last made the consumer
-- forget the aggregate. The reset used to delete the aggregate's row, which
-- made it indistinguishable from an aggregate the consumer never saw, and so
-- open to Config.BaselineBefore: a live event arriving before the replay of
-- the aggregate's history became its baseline, and the replayed versions were
-- then skipped as stale. The reset now keeps the row at version 0 and sets
-- reset_at: the claim never takes a baseline for such an aggregate, so its
-- history starts again at version 1, and a gap on it that times out
-- dead-letters (and heals when the replay brings the predecessor) instead.
-- Only read while version is 0; never cleared, so the row says when the
-- aggregate was last reset.
--
-- Nullable, no default: adding it rewrites nothing and holds the table's
-- lock for an instant, whatever its size.
ALTER TABLE consumer_aggregate_versions ADD COLUMN reset_at timestamptz;

-- +goose Down
ALTER TABLE consumer_aggregate_versions DROP COLUMN reset_at;
