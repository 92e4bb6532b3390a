-- Tool approvals (RequestApproval, DecideApproval): one row per approval,
-- kept with its session (deleted with it). `state`: 1 pending, 2 approved,
-- 3 denied, 4 expired. A decision keeps its request id, its revision and a
-- denial's tool result (the stored message, encoded), so a retry answers
-- the first decision; times are microseconds since the epoch (0: unset).
--
-- A new table that nothing of the previous release reads or writes: expand.
CREATE TABLE IF NOT EXISTS approvals (
    session_key        BIGINT  NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    approval_id        TEXT    NOT NULL,
    tenant             TEXT    NOT NULL,
    run_id             TEXT    NOT NULL,
    tool_call_id       TEXT    NOT NULL,
    title              TEXT    NOT NULL,
    detail_json        TEXT    NOT NULL,
    state              BIGINT  NOT NULL,
    decided_by         TEXT    NOT NULL DEFAULT '',
    reason             TEXT    NOT NULL DEFAULT '',
    create_time        BIGINT  NOT NULL,
    decide_time        BIGINT  NOT NULL DEFAULT 0,
    expire_time        BIGINT  NOT NULL DEFAULT 0,
    decide_request_id  TEXT    NOT NULL DEFAULT '',
    decide_revision    BIGINT  NOT NULL DEFAULT 0,
    tool_result        BLOB,
    PRIMARY KEY (session_key, approval_id)
);
-- ListApprovals: a tenant's, oldest first.
CREATE INDEX IF NOT EXISTS approvals_by_tenant ON approvals (tenant, create_time, approval_id);
-- The sweeper: pending approvals by expiry.
CREATE INDEX IF NOT EXISTS approvals_pending_by_expiry ON approvals (expire_time)
    WHERE state = 1 AND expire_time > 0;
