-- +goose Up
-- Whether a consumer has an open dead letter of an aggregate below a
-- version: the "blocked" check of the idempotency middleware's claim.
-- VOLATILE on purpose: PostgreSQL gives each query of a volatile function a
-- fresh snapshot, so the claim, calling it from ON CONFLICT DO UPDATE after
-- it has locked (and perhaps waited for) the aggregate's version row, sees
-- every dead letter committed by the transactions that held the lock
-- before, which a subquery of the statement itself, reading the snapshot
-- taken before the wait, would not. PL/pgSQL, so that it is never inlined
-- into that snapshot.
-- +goose StatementBegin
CREATE FUNCTION consumer_blocked(p_consumer text, p_aggregate_type text, p_aggregate_id text, p_version bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1 FROM dead_letters
        WHERE consumer = p_consumer AND aggregate_type = p_aggregate_type AND aggregate_id = p_aggregate_id
          AND status IN ('retrying', 'dead', 'held') AND aggregate_version < p_version);
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION consumer_blocked(text, text, text, bigint);
