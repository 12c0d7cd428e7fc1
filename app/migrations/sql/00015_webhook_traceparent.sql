-- +goose Up
-- The trace context of the handler that recorded the delivery (the
-- NotifyMerchant span): the sender's request is a client span in that
-- trace and sends it as `traceparent`. Empty when the event had none.
ALTER TABLE webhook_deliveries ADD COLUMN traceparent text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE webhook_deliveries DROP COLUMN traceparent;
