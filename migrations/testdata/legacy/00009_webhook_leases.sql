-- +goose Up
-- The sender's lease on a delivery: a fresh token per lease. While a
-- delivery is leased, next_attempt_at is the lease's end (another sender may
-- take it after that). Settling checks the token, so a sender whose lease
-- lapsed changes nothing, and a late result never overwrites 'delivered'.
ALTER TABLE webhook_deliveries ADD COLUMN lease_token uuid;

-- An attempt whose sender had lost its lease by the time it settled: the
-- merchant may have received it, so it is recorded, but it decided nothing.
ALTER TABLE webhook_attempts ADD COLUMN lease_lost boolean NOT NULL DEFAULT false;

-- Retention walks settled deliveries oldest first.
CREATE INDEX webhook_deliveries_settled_idx ON webhook_deliveries (created_at) WHERE status <> 'pending';

-- +goose Down
DROP INDEX webhook_deliveries_settled_idx;
ALTER TABLE webhook_attempts DROP COLUMN lease_lost;
ALTER TABLE webhook_deliveries DROP COLUMN lease_token;
