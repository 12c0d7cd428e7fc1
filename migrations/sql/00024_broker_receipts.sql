-- +goose Up
-- Receipts of the broker-loss audit (forwarder/audit.go). When the broker
-- is audited, the transaction that marks a batch published inserts one row
-- here: for each row of the batch the broker acknowledged, where the broker
-- put it (broker topic and position, parallel arrays). The auditor checks
-- every receipt not yet settled against the broker and deletes it once
-- every consumer had the message, or once the row was put back after a
-- loss. So the table holds about one audit interval of batches, and a loss
-- is judged on what PostgreSQL durably knows it published, not on the
-- memory of a process or on an earlier audit.
--
-- One row per batch, not per event: the batch's mark already writes its
-- rows; this adds one small insert (arrays, compressed when large) to it.
CREATE TABLE outbox_receipts (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    published_at  timestamptz NOT NULL DEFAULT now(),
    outbox_ids    bigint[]    NOT NULL,
    broker_topics text[]      NOT NULL,
    positions     text[]      NOT NULL
);

-- The topics the audit covered before receipts: the receipts name their
-- broker topics themselves.
DROP TABLE outbox_audit_topics;

-- A broker topic whose last Check left work for the next one (a trim it
-- decided, applied once its verdict is committed) is checked again even
-- with no receipt to hand it.
ALTER TABLE outbox_audit ADD COLUMN again boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE outbox_audit DROP COLUMN again;
CREATE TABLE outbox_audit_topics (
    topic      text        PRIMARY KEY,
    first_seen timestamptz NOT NULL DEFAULT now()
);
INSERT INTO outbox_audit_topics (topic) SELECT DISTINCT topic FROM outbox_audit;
DROP TABLE outbox_receipts;
