-- +goose Up
-- SyncAnalytics' projection: per merchant, currency and day, written in the
-- consumer's transaction with its processed_messages row (exactly once).
CREATE TABLE merchant_stats_daily (
    merchant_id     text    NOT NULL,
    currency        char(3) NOT NULL,
    day             date    NOT NULL,
    paid_count      bigint  NOT NULL DEFAULT 0,
    paid_amount     bigint  NOT NULL DEFAULT 0,
    refunded_amount bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (merchant_id, currency, day)
);

-- +goose Down
DROP TABLE merchant_stats_daily;
