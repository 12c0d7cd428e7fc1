-- +goose Up
-- The analytics sums as numeric: a bigint wraps (or, in PostgreSQL, fails
-- the consumer's upsert: dead letters) after 9,223 payments of the largest
-- amount in one merchant, currency and day; numeric cannot (app.Total).
ALTER TABLE merchant_stats_daily
    ALTER COLUMN paid_amount TYPE numeric,
    ALTER COLUMN refunded_amount TYPE numeric;

-- The database's half of the amount cap (app.MaxAmount, which the service
-- checks first). NOT VALID: rows written before the cap stay readable and
-- refundable; every new or updated row is checked.
ALTER TABLE payments ADD CONSTRAINT payments_amount_cap CHECK (amount <= 1000000000000000) NOT VALID;

-- +goose Down
ALTER TABLE payments DROP CONSTRAINT payments_amount_cap;
-- Fails, leaving the table as it is, if a sum no longer fits a bigint.
ALTER TABLE merchant_stats_daily
    ALTER COLUMN paid_amount TYPE bigint,
    ALTER COLUMN refunded_amount TYPE bigint;
