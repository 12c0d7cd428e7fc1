-- +goose Up
-- Finds an aggregate's published rows without reading the whole outbox: what
-- `outflow replay --aggregate-id` and `outflow consumer reset` select (package
-- replay). Partial on published rows, so that the producer's INSERT (published_at
-- is NULL) adds nothing to it and pays nothing: the entry is written by the
-- forwarder's mark, which is not a HOT update anyway (published_at is in the
-- pending-rows index's predicate): one more index insertion per mark, which
-- the forwarder pays (docs/benchmarks.md). Pending rows are found through
-- outbox_pending_idx.
CREATE INDEX outbox_aggregate_idx ON outbox (aggregate_type, aggregate_id) WHERE published_at IS NOT NULL;

-- +goose Down
DROP INDEX outbox_aggregate_idx;
