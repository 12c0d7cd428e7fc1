-- +goose Up
-- Set when an operator discards a parked row (forwarder.DiscardParked): the
-- row is released like a retried one, and the forwarder publishes a discard
-- marker (event type outflow.discarded, empty payload) in the event's place
-- rather than the event. A row is not simply marked published: its
-- aggregate's later versions would then reach every strict consumer after a
-- gap, wait GapTimeout and go dead; the marker fills the version, and the
-- consumers' middleware applies it without running their handler. A
-- nullable column without a default: adding it rewrites nothing, and the
-- producer's INSERT does not write it.
ALTER TABLE outbox ADD COLUMN discarded_at timestamptz;

-- +goose Down
ALTER TABLE outbox DROP COLUMN discarded_at;
