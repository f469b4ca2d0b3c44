-- Approvals (issue 32): calls that wait for a person.
--
-- `agent_approval_rules`: per agent, which tools (a tool, a group, or `@destructive` for every
-- tool annotated `destructiveHint: true`) need approval, optionally only when the arguments
-- match `when` (the argument-rule fragment language), who may approve and how long a request
-- waits. Checked by the application before it is written, like argument rules.
CREATE TABLE agent_approval_rules (
    agent_id    UUID        NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    target      TEXT        NOT NULL CHECK (target ~ '^(@destructive|[A-Za-z0-9_.-]{1,64})$'),
    rule        JSONB       NOT NULL CHECK (jsonb_typeof(rule) = 'object'),
    created_by  TEXT        NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (agent_id, target)
);

CREATE TRIGGER agent_approval_rules_notify AFTER INSERT OR UPDATE OR DELETE ON agent_approval_rules
    FOR EACH STATEMENT EXECUTE FUNCTION toolgate_notify_policy();

-- Which approver sets an account belongs to, beside its role (a rule's `approvers` names
-- roles or sets).
ALTER TABLE admin_users ADD COLUMN approver_sets TEXT[] NOT NULL DEFAULT '{}';

-- One request for approval of exactly one call. The binding (agent, person, client, tool,
-- the SHA-256 of the canonical arguments, of the tool definition shown and of the rule that
-- asked) is what a decision applies to; nothing else is ever run under it.
--
-- States: pending -> granted -> running -> done | failed; pending -> denied | expired.
-- `arguments` holds the call's own arguments only while the call may still run: the
-- gateway runs the call itself once it is approved (so a caller polling a task or a status
-- URL gets its result), and erases them when the call ran or cannot run any more.
-- `delivered_at`: when the caller was given the outcome on a retry of the same call; an
-- identical call after that is a new request.
CREATE TABLE approval_requests (
    id                 UUID        PRIMARY KEY,
    state              TEXT        NOT NULL
        CHECK (state IN ('pending', 'granted', 'denied', 'expired', 'running', 'done', 'failed')),
    agent              TEXT        NOT NULL,
    person             TEXT,
    client_id          TEXT        NOT NULL,
    jti                UUID,
    scope              JSONB       NOT NULL,
    surface            TEXT        NOT NULL,
    tool               TEXT        NOT NULL,
    arguments_sha256   TEXT        NOT NULL,
    definition_sha256  TEXT        NOT NULL,
    rule_sha256        TEXT        NOT NULL,
    rule_target        TEXT        NOT NULL,
    approvers          TEXT[]      NOT NULL,
    arguments          JSONB,
    shown_arguments    TEXT        NOT NULL,
    requested_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at         TIMESTAMPTZ NOT NULL,
    decided_at         TIMESTAMPTZ,
    decided_by         TEXT,
    reason             TEXT,
    finished_at        TIMESTAMPTZ,
    outcome            JSONB,
    call_id            TEXT,
    delivered_at       TIMESTAMPTZ
);

-- A caller's retry finds its request by the binding, and there is at most one open request
-- per binding: identical calls racing make one request, never one each.
CREATE UNIQUE INDEX approval_requests_binding_idx
    ON approval_requests (agent, client_id, coalesce(person, ''), tool, arguments_sha256,
                          definition_sha256, rule_sha256)
    WHERE delivered_at IS NULL;
CREATE INDEX approval_requests_pending_idx
    ON approval_requests (expires_at) WHERE state = 'pending';
CREATE INDEX approval_requests_state_idx ON approval_requests (state, requested_at DESC);

-- Decisions need no notification: every instance reads a request from here when its caller
-- comes back, so a decision made on one is seen on all at once.

-- What the last `policy apply` wrote includes approval rules: one added in the admin UI or
-- the API is kept by the next apply (removing it would let calls run unapproved) unless
-- `--prune`.
ALTER TABLE policy_applied DROP CONSTRAINT policy_applied_kind_check;
ALTER TABLE policy_applied ADD CONSTRAINT policy_applied_kind_check
    CHECK (kind IN ('agent', 'grant', 'user', 'approval'));
