-- A row or more in every table of the single-set release's schema (valid
-- from its migration 00007 on), for the upgrade tests: every one of them
-- must be there, unchanged, after the upgrade.
BEGIN;
INSERT INTO outbox (message_id, topic, aggregate_type, aggregate_id, aggregate_version, event_type, payload, metadata, occurred_at, created_at, published_at, attempts)
VALUES ('00000000-0000-0000-0000-000000000001', 'payments', 'payment', 'pay_1', 1, 'payment.created', '{"amount": 1000}', '{"correlation_id": "c1"}', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z', '2026-01-01T00:00:01Z', 1),
       ('00000000-0000-0000-0000-000000000002', 'payments', 'payment', 'pay_1', 2, 'payment.paid', '{"amount": 1000}', '{}', '2026-01-01T00:00:02Z', '2026-01-01T00:00:02Z', NULL, 0);
INSERT INTO outbox_partitions (partition, owner, lease_until, published_total) VALUES (0, 'fwd-a', '2026-01-01T00:01:00Z', 1), (1, NULL, NULL, 0);
INSERT INTO outbox_forwarders (id, started_at, heartbeat_at) VALUES ('fwd-a', '2026-01-01T00:00:00Z', '2026-01-01T00:00:30Z');
INSERT INTO processed_messages (message_id, consumer, processed_at) VALUES ('00000000-0000-0000-0000-000000000001', 'sync-analytics', '2026-01-01T00:00:03Z');
INSERT INTO consumer_aggregate_versions (consumer, aggregate_type, aggregate_id, version, prev_version, updated_at)
VALUES ('sync-analytics', 'payment', 'pay_1', 1, 0, '2026-01-01T00:00:03Z');
INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, metadata, status, reason, error, attempts, created_at)
VALUES ('notify-merchant', '00000000-0000-0000-0000-000000000001', 'payment.created', 'payment', 'pay_1', 1, '\x7b7d', '{}', 'dead', 'handler', 'boom', 8, '2026-01-01T00:00:04Z');
INSERT INTO merchants (id, name, webhook_url, webhook_secret, created_at)
VALUES ('10000000-0000-0000-0000-000000000001', 'Shop', 'https://shop.example/hooks', 'secret', '2026-01-01T00:00:00Z');
INSERT INTO payments (id, merchant_id, amount, refunded_amount, currency, status, version, created_at, updated_at)
VALUES ('20000000-0000-0000-0000-000000000001', '10000000-0000-0000-0000-000000000001', 1000, 0, 'EUR', 'paid', 2, '2026-01-01T00:00:00Z', '2026-01-01T00:00:02Z');
INSERT INTO ledger_transactions (id, payment_id, kind, created_at)
VALUES ('30000000-0000-0000-0000-000000000001', '20000000-0000-0000-0000-000000000001', 'pay', '2026-01-01T00:00:02Z');
INSERT INTO ledger_entries (transaction_id, account, amount, currency)
VALUES ('30000000-0000-0000-0000-000000000001', 'customer', 1000, 'EUR'), ('30000000-0000-0000-0000-000000000001', 'merchant', -1000, 'EUR');
INSERT INTO idempotency_keys (key, request_hash, status_code, response_body, created_at)
VALUES ('key-1', '\x0102', 201, '\x7b7d', '2026-01-01T00:00:00Z');
INSERT INTO merchant_stats_daily (merchant_id, currency, day, paid_count, paid_amount, refunded_amount)
VALUES ('10000000-0000-0000-0000-000000000001', 'EUR', '2026-01-01', 1, 1000, 0);
INSERT INTO webhook_deliveries (message_id, merchant_id, url, event_type, body, status, attempts, next_attempt_at, created_at)
VALUES ('00000000-0000-0000-0000-000000000001', '10000000-0000-0000-0000-000000000001', 'https://shop.example/hooks', 'payment.created', '\x7b7d', 'delivered', 1, '2026-01-01T00:00:05Z', '2026-01-01T00:00:04Z');
INSERT INTO webhook_attempts (delivery_id, attempted_at, status_code, latency_ms)
SELECT id, '2026-01-01T00:00:05Z', 200, 12.5 FROM webhook_deliveries;
COMMIT;
