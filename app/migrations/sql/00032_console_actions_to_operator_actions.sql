-- +goose Up
-- The console records its actions in the framework's audit,
-- outflow_operator_actions (framework migration 00031), with the outflow
-- tool's. console_actions (00018) is no longer written by this release:
-- its rows are copied there, once (a row already copied is not copied
-- again, so running this after a down is safe), and left in place.
--
-- During a rolling upgrade, a console of the previous release still
-- inserts into console_actions: the trigger copies each such row as it is
-- written, so that nothing an operator does goes missing from the audit
-- this release reads. Drop the trigger, and console_actions, once no
-- instance of an earlier release is left (a later release will).
--
-- Online: an INSERT ... SELECT of a small table (operators' actions), and
-- a trigger, which takes a moment's SHARE ROW EXCLUSIVE lock on
-- console_actions.
INSERT INTO outflow_operator_actions (at, actor_kind, actor_id, actor_name, action, target, result_count, error,
                                      aggregate_type, aggregate_id)
SELECT c.at, 'console', c.api_key_id::text, c.api_key_name, c.action, c.target, c.result_count, c.error,
       CASE WHEN c.action = 'replay' AND c.target ? 'aggregate_type' AND c.target ? 'aggregate_id' THEN c.target->>'aggregate_type' END,
       CASE WHEN c.action = 'replay' AND c.target ? 'aggregate_type' AND c.target ? 'aggregate_id' THEN c.target->>'aggregate_id' END
FROM console_actions c
WHERE NOT EXISTS (
    SELECT 1 FROM outflow_operator_actions o
    WHERE o.actor_kind = 'console' AND o.at = c.at AND o.actor_id = c.api_key_id::text
      AND o.action = c.action AND o.target = c.target)
ORDER BY c.id;

-- The inserting session's search_path finds the framework's table, as it
-- found console_actions (an earlier release qualifies neither). A
-- framework set rolled back on its own (the table gone) leaves
-- console_actions writable.
-- +goose StatementBegin
CREATE FUNCTION console_actions_to_operator_actions() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF to_regclass('outflow_operator_actions') IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO outflow_operator_actions (at, actor_kind, actor_id, actor_name, action, target, result_count, error,
                                          aggregate_type, aggregate_id)
    VALUES (NEW.at, 'console', NEW.api_key_id::text, NEW.api_key_name, NEW.action, NEW.target, NEW.result_count, NEW.error,
            CASE WHEN NEW.action = 'replay' AND NEW.target ? 'aggregate_type' AND NEW.target ? 'aggregate_id' THEN NEW.target->>'aggregate_type' END,
            CASE WHEN NEW.action = 'replay' AND NEW.target ? 'aggregate_type' AND NEW.target ? 'aggregate_id' THEN NEW.target->>'aggregate_id' END);
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER console_actions_to_operator_actions AFTER INSERT ON console_actions
    FOR EACH ROW EXECUTE FUNCTION console_actions_to_operator_actions();

-- +goose Down
-- The copies stay in the framework's table (its set owns it; it may be
-- rolled back on its own), and console_actions still holds every row.
DROP TRIGGER console_actions_to_operator_actions ON console_actions;
DROP FUNCTION console_actions_to_operator_actions();
