-- +goose Up
ALTER TABLE refunds ADD COLUMN reason text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE refunds DROP COLUMN reason;
