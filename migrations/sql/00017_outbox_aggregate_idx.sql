-- +goose Up
-- Finds an aggregate's retained rows without reading the whole outbox: what
-- `outflow replay --aggregate-id` and `outflow consumer reset` select (package
-- replay). Its cost on the write path, measured with the pay benchmark, is in
-- docs/benchmarks.md.
CREATE INDEX outbox_aggregate_idx ON outbox (aggregate_type, aggregate_id);

-- +goose Down
DROP INDEX outbox_aggregate_idx;
