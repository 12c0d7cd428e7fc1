-- +goose Up
-- An account's webhook endpoints. The account is the service's own notion
-- (the reference app's merchant id), kept as text.
CREATE TABLE webhook_endpoints (
    id                         uuid        PRIMARY KEY,
    account_id                 text        NOT NULL,
    url                        text        NOT NULL,
    description                text        NOT NULL DEFAULT '',
    -- The event types the endpoint wants: exact names, or a prefix ending
    -- in ".*" ("payment.*"). Empty: every type.
    event_types                text[]      NOT NULL DEFAULT '{}',
    -- The payload version the endpoint was made for: the sender renders
    -- each message in it, whatever the service's current version.
    api_version                text        NOT NULL DEFAULT '',
    -- Requests per second at most; NULL: no limit but the sender's own.
    rate_limit                 integer     CHECK (rate_limit > 0),
    disabled_at                timestamptz,
    disabled_reason            text        CHECK (disabled_reason IN ('manual', 'failing')),
    -- The signing secret, sealed with the endpoint's id as associated data
    -- ("enc:v1:...", see webhooks/secretseal) or plaintext "whsec_...". A
    -- rotation keeps the replaced one, in the same form, until
    -- previous_secret_expires_at: the sender signs with both until then.
    secret                     text        NOT NULL,
    previous_secret            text,
    previous_secret_expires_at timestamptz,
    -- The sender's health record: when the current run of failed attempts
    -- began (NULL after a success), how long it is, and until when the
    -- circuit is open (no request but a probe once it has passed).
    failing_since              timestamptz,
    consecutive_failures       integer     NOT NULL DEFAULT 0,
    circuit_open_until         timestamptz,
    created_at                 timestamptz NOT NULL DEFAULT now(),
    updated_at                 timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT webhook_endpoints_disabled_check CHECK ((disabled_at IS NULL) = (disabled_reason IS NULL)),
    CONSTRAINT webhook_endpoints_previous_secret_check
        CHECK ((previous_secret IS NULL) = (previous_secret_expires_at IS NULL))
);
CREATE INDEX webhook_endpoints_account_idx ON webhook_endpoints (account_id, created_at);
-- The operators' counts (deliveries.ReadStats): the disabled endpoints, and
-- those whose circuit is or was open, few of many.
CREATE INDEX webhook_endpoints_disabled_idx ON webhook_endpoints (disabled_at) WHERE disabled_at IS NOT NULL;
CREATE INDEX webhook_endpoints_circuit_idx ON webhook_endpoints (circuit_open_until)
    WHERE circuit_open_until IS NOT NULL;

-- One message per event that at least one of its account's endpoints
-- wants (or a test event, or an endpoint.disabled notice). Its id is the
-- webhook-id every endpoint receives: the event's message id.
CREATE TABLE webhook_messages (
    id             uuid        PRIMARY KEY,
    account_id     text        NOT NULL,
    event_type     text        NOT NULL,
    occurred_at    timestamptz NOT NULL,
    -- The payload as the producer wrote it, in its schema version: the
    -- sender renders it for each endpoint's api_version.
    schema_version integer     NOT NULL DEFAULT 1,
    payload        bytea       NOT NULL,
    traceparent    text        NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_messages_account_idx ON webhook_messages (account_id, created_at);

-- The sender's queue: one row per message and endpoint. While a delivery is
-- leased, next_attempt_at is the lease's end and lease_token its token. A
-- delivery of an endpoint whose circuit is open waits with next_attempt_at
-- at the circuit's end, out of the due scan's way. 'failed' is final until
-- an operator or the merchant resends or recovers it.
CREATE TABLE webhook_endpoint_deliveries (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id      uuid        NOT NULL REFERENCES webhook_messages (id) ON DELETE CASCADE,
    endpoint_id     uuid        NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    status          text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_token     uuid,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    settled_at      timestamptz,
    CONSTRAINT webhook_endpoint_deliveries_message_endpoint_key UNIQUE (message_id, endpoint_id)
);
CREATE INDEX webhook_endpoint_deliveries_due_idx ON webhook_endpoint_deliveries (next_attempt_at)
    WHERE status = 'pending';
CREATE INDEX webhook_endpoint_deliveries_endpoint_idx ON webhook_endpoint_deliveries (endpoint_id, created_at);
-- The failed deliveries, which wait for an operator or their account: the
-- operators' count and list of them (newest first, by id) read it alone.
CREATE INDEX webhook_endpoint_deliveries_failed_idx ON webhook_endpoint_deliveries (id) WHERE status = 'failed';
-- The failing deliveries (pending after a failed attempt), a few of the
-- pending: the operators' count and list of them read it alone.
CREATE INDEX webhook_endpoint_deliveries_failing_idx ON webhook_endpoint_deliveries (id)
    WHERE status = 'pending' AND attempts > 0;
CREATE INDEX webhook_endpoint_deliveries_settled_idx ON webhook_endpoint_deliveries (created_at)
    WHERE status <> 'pending';

-- Every HTTP attempt. An attempt whose sender had lost its lease by the
-- time it settled is recorded (the endpoint may have received it) with
-- lease_lost, and decided nothing.
CREATE TABLE webhook_endpoint_attempts (
    id            bigint           GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id   bigint           NOT NULL REFERENCES webhook_endpoint_deliveries (id) ON DELETE CASCADE,
    endpoint_id   uuid             NOT NULL,
    attempted_at  timestamptz      NOT NULL DEFAULT now(),
    status_code   integer,
    latency_ms    double precision NOT NULL,
    error         text,
    -- At most 1 KiB of the response's body, secrets masked.
    response_body text,
    lease_lost    boolean          NOT NULL DEFAULT false
);
CREATE INDEX webhook_endpoint_attempts_delivery_idx ON webhook_endpoint_attempts (delivery_id);
CREATE INDEX webhook_endpoint_attempts_endpoint_idx ON webhook_endpoint_attempts (endpoint_id, attempted_at);

-- +goose Down
DROP TABLE webhook_endpoint_attempts;
DROP TABLE webhook_endpoint_deliveries;
DROP TABLE webhook_messages;
DROP TABLE webhook_endpoints;
