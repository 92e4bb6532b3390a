-- EraseUser: a user's deleted sessions (tombstones) found by index while
-- their rows are erased in bounded batches, and the content-free record
-- each erasure leaves: when, the tenant, a SHA-256 of the user, counts.
CREATE INDEX sessions_tombstones_by_user ON sessions (tenant, user_name) WHERE deleted = 1;

CREATE TABLE erasures (
    id                     BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant                 TEXT   NOT NULL,
    user_sha256            TEXT   NOT NULL,
    time                   BIGINT NOT NULL,
    sessions_deleted       BIGINT NOT NULL,
    messages_deleted       BIGINT NOT NULL,
    provider_calls_deleted BIGINT NOT NULL,
    state_entries_deleted  BIGINT NOT NULL
);

-- A spilled delta names its session, so erasing the session erases it.
ALTER TABLE delta_spill ADD COLUMN session_key BIGINT NOT NULL DEFAULT 0;
CREATE INDEX delta_spill_by_session ON delta_spill (session_key);
