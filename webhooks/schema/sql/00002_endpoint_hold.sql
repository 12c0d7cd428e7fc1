-- +goose Up
-- A failing endpoint's deliveries out of the healthy endpoints' way.
--
-- held_until: while an endpoint's retry is pending, its other deliveries
-- wait for the retry's outcome until then, outside the due scan: a failing
-- endpoint leaves one due delivery in the queue, not its backlog. A
-- success releases them; new deliveries to it are recorded held.
--
-- suspect: the delivery's endpoint had failed when it was last recorded,
-- held or retried. The due index is split by it in two lanes: the lease
-- reads the healthy lane in order without walking the failing endpoints'
-- due retries, which wait there for the suspect lane's few slots, and
-- reads the suspect lane only when it has a slot free. The sender still
-- decides the lane from the endpoint's state: a stale mark costs a scan,
-- never a delivery.
--
-- pending_idx finds an endpoint's pending deliveries (to hold, release or
-- probe) without reading its settled history.
--
-- In one transaction, not CONCURRENTLY: a concurrent build deadlocks with
-- instances waiting for the migration lock (see the framework's 00020).
-- The columns take constant defaults (no rewrite); the three builds read
-- the deliveries table once each and hold off its writes meanwhile (the
-- fan-out handler waits; nothing is lost); the old due index goes in the
-- same transaction, so no moment has neither.
ALTER TABLE webhook_endpoints ADD COLUMN held_until timestamptz;
ALTER TABLE webhook_endpoint_deliveries ADD COLUMN suspect boolean NOT NULL DEFAULT false;
CREATE INDEX webhook_endpoint_deliveries_pending_idx
    ON webhook_endpoint_deliveries (endpoint_id, next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_endpoint_deliveries_due_healthy_idx
    ON webhook_endpoint_deliveries (next_attempt_at) WHERE status = 'pending' AND NOT suspect;
CREATE INDEX webhook_endpoint_deliveries_due_suspect_idx
    ON webhook_endpoint_deliveries (next_attempt_at) WHERE status = 'pending' AND suspect;
DROP INDEX webhook_endpoint_deliveries_due_idx;

-- +goose Down
CREATE INDEX webhook_endpoint_deliveries_due_idx
    ON webhook_endpoint_deliveries (next_attempt_at) WHERE status = 'pending';
DROP INDEX webhook_endpoint_deliveries_due_suspect_idx;
DROP INDEX webhook_endpoint_deliveries_due_healthy_idx;
DROP INDEX webhook_endpoint_deliveries_pending_idx;
ALTER TABLE webhook_endpoint_deliveries DROP COLUMN suspect;
ALTER TABLE webhook_endpoints DROP COLUMN held_until;
