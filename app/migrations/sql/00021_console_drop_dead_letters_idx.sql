-- +goose Up
-- 00018 added console_dead_letters_open_status_idx, (consumer, status) of
-- the open dead letters, so that the console's overview counts them from
-- the index alone. The framework's 00020 now does that index's job with
-- dead_letters_open_consumer_status_idx, (consumer, status, id) over the
-- same rows, which also serves the lists in id order: this one would only
-- cost every write of an open dead letter one more index entry. IF EXISTS:
-- a database whose framework set was rolled back has no dead_letters, nor
-- this index. Not CONCURRENTLY, for the reason 00020 gives.
DROP INDEX IF EXISTS console_dead_letters_open_status_idx;

-- +goose Down
-- Back to 00018's state, if the framework's table is still there (its set
-- may have been rolled back first).
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass('dead_letters') IS NOT NULL THEN
        CREATE INDEX IF NOT EXISTS console_dead_letters_open_status_idx ON dead_letters (consumer, status)
            WHERE status IN ('retrying', 'dead', 'held');
    END IF;
END
$$;
-- +goose StatementEnd
