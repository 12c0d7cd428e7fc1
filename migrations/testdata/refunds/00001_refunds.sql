-- +goose Up
-- A service's own table, beside the framework's: what a user's set looks like.
CREATE TABLE refunds (
    id         uuid PRIMARY KEY,
    payment_id text NOT NULL,
    amount     bigint NOT NULL CHECK (amount > 0),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE refunds;
