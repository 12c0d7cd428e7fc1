-- +goose NO TRANSACTION
-- +goose Up
-- Merchants' webhooks move to the framework's package (webhooks/schema's
-- tables, a set applied before this one): each merchant's one URL becomes
-- an endpoint of its own, and the deliveries still pending in the legacy
-- webhook_deliveries are handed over to the new sender by
-- handlers.HandOver, which marks each one it moved 'moved'.
--
-- Online, and each statement can run again (NO TRANSACTION): the CHECK is
-- swapped under a moment's lock, then validated without blocking writes;
-- the trigger and the endpoints are made in one transaction, which holds
-- merchants' writers back (SHARE ROW EXCLUSIVE) only while one row per
-- merchant is inserted.

-- 'moved': handed over to webhook_endpoint_deliveries. A sender of an
-- earlier release never writes it, and its settle (status = 'pending' AND
-- its lease token) matches no moved row: its late result is recorded as a
-- lease_lost attempt and decides nothing.
ALTER TABLE webhook_deliveries
    DROP CONSTRAINT IF EXISTS webhook_deliveries_status_check,
    ADD CONSTRAINT webhook_deliveries_status_check CHECK (status IN ('pending', 'delivered', 'dead', 'moved')) NOT VALID;
ALTER TABLE webhook_deliveries VALIDATE CONSTRAINT webhook_deliveries_status_check;

-- While API processes of an earlier release still write merchants (a
-- rolling upgrade), the trigger keeps each merchant's endpoint in step: a
-- merchant created gets its endpoint; a URL changed or a secret rotated
-- reaches the endpoint whose id is the merchant's, if it still exists (one
-- the merchant deleted through the endpoints API is never made again),
-- and only what changed (a URL the merchant set through the endpoints API
-- survives a secret rotated through the old one). The endpoint's id is the
-- merchant's, so the secret, sealed with the merchant id as associated
-- data, opens as the endpoint's. The writing session's search_path finds
-- webhook_endpoints as it found merchants; the webhook set rolled back on
-- its own (the table gone) leaves merchants writable. Drop the trigger
-- once no instance of an earlier release is left (a later release will).
--
-- The endpoints are made after the trigger, in its transaction (one
-- query string, which PostgreSQL runs as one transaction, rolled back
-- whole on an error): CREATE TRIGGER waits for the merchants' writers
-- under way and holds new ones back until the commit, so every merchant
-- written before is copied, and every one written after goes through the
-- trigger. A merchant that already has an endpoint (this migration run
-- before, rolled back and run again) is left as it is; one with no
-- endpoint at all when it runs again (it deleted every one) gets its
-- webhook_url back as one.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION merchants_webhook_endpoint() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF to_regclass('webhook_endpoints') IS NULL THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO webhook_endpoints (id, account_id, url, description, event_types, secret,
                                       previous_secret, previous_secret_expires_at, created_at)
        VALUES (NEW.id, NEW.id::text, NEW.webhook_url, 'webhook_url of the merchant', '{}', NEW.webhook_secret,
                NEW.previous_webhook_secret, NEW.previous_webhook_secret_expires_at, NEW.created_at)
        ON CONFLICT (id) DO NOTHING;
        RETURN NULL;
    END IF;
    UPDATE webhook_endpoints e SET
        url = CASE WHEN OLD.webhook_url IS DISTINCT FROM NEW.webhook_url THEN NEW.webhook_url ELSE e.url END,
        secret = CASE WHEN secrets_changed THEN NEW.webhook_secret ELSE e.secret END,
        previous_secret = CASE WHEN secrets_changed THEN NEW.previous_webhook_secret ELSE e.previous_secret END,
        previous_secret_expires_at = CASE WHEN secrets_changed THEN NEW.previous_webhook_secret_expires_at
                                          ELSE e.previous_secret_expires_at END,
        updated_at = now()
    FROM (SELECT (OLD.webhook_secret, OLD.previous_webhook_secret, OLD.previous_webhook_secret_expires_at)
                 IS DISTINCT FROM
                 (NEW.webhook_secret, NEW.previous_webhook_secret, NEW.previous_webhook_secret_expires_at) AS secrets_changed) c
    WHERE e.id = NEW.id;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS merchants_webhook_endpoint_insert ON merchants;
CREATE TRIGGER merchants_webhook_endpoint_insert AFTER INSERT ON merchants
    FOR EACH ROW EXECUTE FUNCTION merchants_webhook_endpoint();
DROP TRIGGER IF EXISTS merchants_webhook_endpoint_update ON merchants;
CREATE TRIGGER merchants_webhook_endpoint_update
    AFTER UPDATE OF webhook_url, webhook_secret, previous_webhook_secret, previous_webhook_secret_expires_at ON merchants
    FOR EACH ROW
    WHEN ((OLD.webhook_url, OLD.webhook_secret, OLD.previous_webhook_secret, OLD.previous_webhook_secret_expires_at)
          IS DISTINCT FROM
          (NEW.webhook_url, NEW.webhook_secret, NEW.previous_webhook_secret, NEW.previous_webhook_secret_expires_at))
    EXECUTE FUNCTION merchants_webhook_endpoint();
-- Every merchant gets every event type, as its one URL did.
INSERT INTO webhook_endpoints (id, account_id, url, description, event_types, secret,
                               previous_secret, previous_secret_expires_at, created_at)
SELECT m.id, m.id::text, m.webhook_url, 'webhook_url of the merchant', '{}', m.webhook_secret,
       m.previous_webhook_secret, m.previous_webhook_secret_expires_at, m.created_at
FROM merchants m
WHERE NOT EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.account_id = m.id::text)
ON CONFLICT (id) DO NOTHING;
-- +goose StatementEnd

-- +goose Down
-- The endpoints stay (the webhook set owns them, and they may have been
-- changed through the endpoints API since), and so do the deliveries
-- handed over. The CHECK is narrowed again only when no delivery is
-- 'moved' (checked under a lock that holds writers back for the scan);
-- otherwise it stays as wide, which no earlier release minds: none writes
-- 'moved', and none of its statements matches such a row.
DROP TRIGGER IF EXISTS merchants_webhook_endpoint_update ON merchants;
DROP TRIGGER IF EXISTS merchants_webhook_endpoint_insert ON merchants;
DROP FUNCTION IF EXISTS merchants_webhook_endpoint();
-- +goose StatementBegin
DO $$
BEGIN
    LOCK TABLE webhook_deliveries IN SHARE MODE;
    IF EXISTS (SELECT 1 FROM webhook_deliveries WHERE status = 'moved') THEN
        RAISE NOTICE 'webhook_deliveries holds moved deliveries: its status CHECK keeps ''moved''';
        RETURN;
    END IF;
    ALTER TABLE webhook_deliveries
        DROP CONSTRAINT webhook_deliveries_status_check,
        ADD CONSTRAINT webhook_deliveries_status_check CHECK (status IN ('pending', 'delivered', 'dead')) NOT VALID;
END
$$;
-- +goose StatementEnd
ALTER TABLE webhook_deliveries VALIDATE CONSTRAINT webhook_deliveries_status_check;
