-- +goose Up
CREATE TABLE payouts (
    id            uuid PRIMARY KEY,
    merchant_id   text        NOT NULL,
    amount_minor  bigint      NOT NULL CHECK (amount_minor > 0),
    currency      char(3)     NOT NULL,
    status        text        NOT NULL CHECK (status IN ('requested', 'sent', 'failed')),
    failure       text,
    -- The aggregate's version: each change bumps it, and the change's
    -- event carries it, so consumers apply a payout's events in order.
    version       bigint      NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX payouts_merchant_idx ON payouts (merchant_id);

-- The consumer's projection: what each merchant has in flight and paid out.
CREATE TABLE payout_balances (
    merchant_id     text   NOT NULL,
    currency        char(3) NOT NULL,
    in_flight_minor bigint NOT NULL DEFAULT 0,
    paid_out_minor  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (merchant_id, currency)
);

-- +goose Down
DROP TABLE payout_balances;
DROP TABLE payouts;
