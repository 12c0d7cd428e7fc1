-- +goose Up
-- The broker-loss audit (forwarder/audit.go). A broker can come back with
-- less than it acknowledged (a Redis failover to a replica that had not
-- caught up, a restart without persistence, a NATS stream recreated); the
-- forwarder that holds partition 0 audits every broker topic the outbox
-- publishes to and publishes again what a loss may have taken.

-- The outbox topics forwarded at least once: the audit covers their broker
-- topics. Each forwarder process records a topic once, the first time it
-- publishes a row of it.
CREATE TABLE outbox_audit_topics (
    topic      text        PRIMARY KEY,
    first_seen timestamptz NOT NULL DEFAULT now()
);

-- One row per broker topic (stream, subject): the auditor's state as of the
-- last audit (opaque to the forwarder, kept here so that a restart or the
-- audit moving to another instance keeps the baseline), and the last loss.
-- repair_from_id is the smallest outbox id the last repair put back: every
-- forwarder instance lowers its claim's low-water mark to it.
CREATE TABLE outbox_audit (
    broker_topic     text        PRIMARY KEY,
    topic            text        NOT NULL,
    state            bytea,
    audited_at       timestamptz NOT NULL DEFAULT now(),
    last_loss_at     timestamptz,
    last_loss_reason text,
    last_loss_since  timestamptz,
    last_repaired    bigint      NOT NULL DEFAULT 0,
    repair_from_id   bigint
);

-- +goose Down
DROP TABLE outbox_audit;
DROP TABLE outbox_audit_topics;
