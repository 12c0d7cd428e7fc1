-- +goose Up
-- The audit of what operators did (internal/actionlog): every action of
-- the console and every command of the outflow tool that changes state
-- (retry or discard of dead letters and parked rows, replays, consumer
-- resets, ...), whoever ran it, in the framework's set so that a service's
-- own database, holding only the framework's tables, has it too. A row is
-- written in the transaction of the change it records (a failed action
-- alone, with its error); nothing updates or deletes one.
--
-- actor_kind says where the action came from: 'console' (actor_id and
-- actor_name are the API key's id and name, or the FrameworkOnly console's
-- operator key), or 'cli' (actor_id is the OS user@host, command the
-- command line, secrets masked). target is what the action named (ids, or
-- the filter of "all"). aggregate_type and aggregate_id are set when the
-- action named one aggregate (a replay, a consumer reset of one
-- aggregate): the journey reads an aggregate's through the partial index.
--
-- Online: a new table, empty, and its indexes.
CREATE TABLE outflow_operator_actions (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at             timestamptz NOT NULL DEFAULT now(),
    actor_kind     text        NOT NULL CHECK (actor_kind IN ('console', 'cli')),
    actor_id       text        NOT NULL,
    actor_name     text        NOT NULL,
    command        text        NOT NULL DEFAULT '',
    action         text        NOT NULL,
    target         jsonb       NOT NULL,
    result_count   bigint      NOT NULL,
    error          text        NOT NULL DEFAULT '',
    aggregate_type text,
    aggregate_id   text,
    CHECK ((aggregate_type IS NULL) = (aggregate_id IS NULL))
);
-- An aggregate's actions of one kind, newest first (the journey's replays).
CREATE INDEX outflow_operator_actions_aggregate_idx ON outflow_operator_actions (aggregate_type, aggregate_id, action, id)
    WHERE aggregate_id IS NOT NULL;
-- The actions page's filter by action, newest first, and the list of the
-- actions that exist (a loose index scan).
CREATE INDEX outflow_operator_actions_action_idx ON outflow_operator_actions (action, id);

-- +goose Down
DROP TABLE outflow_operator_actions;
