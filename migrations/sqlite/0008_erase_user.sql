-- EraseUser: a user's deleted sessions (tombstones) found by index while
-- their rows are erased in bounded batches, and the content-free record
-- each erasure leaves: when, the tenant, a SHA-256 of the user, counts.
CREATE INDEX sessions_tombstones_by_user ON sessions (tenant, user_name) WHERE deleted = 1;

CREATE TABLE erasures (
    id                     INTEGER PRIMARY KEY,
    tenant                 TEXT    NOT NULL,
    user_sha256            TEXT    NOT NULL,
    time                   INTEGER NOT NULL,
    sessions_deleted       INTEGER NOT NULL,
    messages_deleted       INTEGER NOT NULL,
    provider_calls_deleted INTEGER NOT NULL,
    state_entries_deleted  INTEGER NOT NULL
);
