-- +goose Up
CREATE TABLE merchants (
    id             uuid        PRIMARY KEY,
    name           text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    webhook_url    text        NOT NULL,
    webhook_secret text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE payments (
    id              uuid        PRIMARY KEY,
    merchant_id     uuid        NOT NULL REFERENCES merchants (id),
    amount          bigint      NOT NULL CHECK (amount > 0),
    refunded_amount bigint      NOT NULL DEFAULT 0,
    currency        char(3)     NOT NULL,
    status          text        NOT NULL CHECK (status IN ('pending', 'paid', 'partially_refunded', 'refunded', 'canceled')),
    version         bigint      NOT NULL CHECK (version >= 1),
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    CHECK (refunded_amount BETWEEN 0 AND amount)
);
CREATE INDEX payments_merchant_idx ON payments (merchant_id);

-- Double-entry ledger: every money movement is a ledger transaction whose
-- entries sum to zero per currency. Amounts are signed: debit > 0, credit < 0.
CREATE TABLE ledger_transactions (
    id         uuid        PRIMARY KEY,
    payment_id uuid        NOT NULL REFERENCES payments (id),
    kind       text        NOT NULL,
    created_at timestamptz NOT NULL
);
CREATE INDEX ledger_transactions_payment_idx ON ledger_transactions (payment_id);

CREATE TABLE ledger_entries (
    id             bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    transaction_id uuid    NOT NULL REFERENCES ledger_transactions (id),
    account        text    NOT NULL,
    amount         bigint  NOT NULL CHECK (amount <> 0),
    currency       char(3) NOT NULL
);
CREATE INDEX ledger_entries_transaction_idx ON ledger_entries (transaction_id);

-- The database's half of the balance rule (the code checks first): checked
-- at commit, so a transaction may insert its entries one by one.
-- +goose StatementBegin
CREATE FUNCTION ledger_check_balanced() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    txid uuid := CASE WHEN TG_OP = 'DELETE' THEN OLD.transaction_id ELSE NEW.transaction_id END;
BEGIN
    IF EXISTS (
        SELECT 1 FROM ledger_entries WHERE transaction_id = txid
        GROUP BY currency HAVING sum(amount) <> 0
    ) THEN
        RAISE EXCEPTION 'ledger transaction % is not balanced', txid
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ledger_entries_balanced';
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE CONSTRAINT TRIGGER ledger_entries_balanced
    AFTER INSERT OR UPDATE OR DELETE ON ledger_entries
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION ledger_check_balanced();

-- +goose Down
DROP TABLE ledger_entries;
DROP FUNCTION ledger_check_balanced();
DROP TABLE ledger_transactions;
DROP TABLE payments;
DROP TABLE merchants;
