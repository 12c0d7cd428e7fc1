-- +goose Up
-- Large bodies by reference (issue 26, the claim check of events/claimcheck):
-- an event whose payload is at least the writer's threshold keeps its body
-- here, written in the business transaction with the outbox row, which
-- carries only a reference (message id, sha256, size in its metadata).
-- The broker never sees the body; a consumer fetches it by message id.
--
-- bytea, not jsonb: the very bytes the writer encoded, which the sha256 in
-- the reference is of (jsonb would reformat them). id is only the purge's
-- walk order; the consumer reads by message_id.
--
-- Rights: nobody but the owner (the role that runs the migrations, and
-- writes the events) reads a body unless granted outflow_claim_reader. A
-- consumer connected as a role without it gets "permission denied" from
-- PostgreSQL itself, which events/claimcheck reports as ErrBodyForbidden.
-- A role rather than a SECURITY DEFINER function with an allow-list: the
-- database enforces it for every client (psql, a BI tool, a consumer in
-- another language), \dp shows it, and it is granted and revoked by the
-- means an administrator already audits. The role is cluster-wide and
-- created once; a migration run by a role that may not create roles
-- leaves it to an administrator (a NOTICE says so), and the table is then
-- the owner's only: refused by default, never open.
--
-- Online: a new table, empty.
CREATE TABLE outflow_claim_bodies (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id uuid        NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now(),
    sha256     bytea       NOT NULL CHECK (length(sha256) = 32),
    size       integer     NOT NULL CHECK (size >= 0),
    body       bytea       NOT NULL
);
REVOKE ALL ON outflow_claim_bodies FROM PUBLIC;

-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outflow_claim_reader') THEN
        BEGIN
            CREATE ROLE outflow_claim_reader NOLOGIN;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN NULL; -- created meanwhile by another schema's migration
            WHEN insufficient_privilege THEN
                RAISE NOTICE 'outflow: role outflow_claim_reader not created (no CREATEROLE): bodies by reference are readable by the table''s owner only until an administrator creates it and grants SELECT ON outflow_claim_bodies to it';
        END;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outflow_claim_reader') THEN
        GRANT SELECT ON outflow_claim_bodies TO outflow_claim_reader;
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The role stays: it is shared by every schema and database of the cluster.
DROP TABLE outflow_claim_bodies;
