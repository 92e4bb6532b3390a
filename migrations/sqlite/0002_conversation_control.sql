-- Conversation control (SQLite): forks, run leases, redaction, per-session
-- state, full-text search, and the indexes the background sweeper uses.

ALTER TABLE sessions ADD COLUMN parent_session_id TEXT    NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN parent_sequence   INTEGER NOT NULL DEFAULT 0;
-- The run holding the session's lease ('' when free) and when it runs out.
ALTER TABLE sessions ADD COLUMN run_id            TEXT    NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN run_expire_time   INTEGER NOT NULL DEFAULT 0;

-- The sweeper: expired leases, idle live sessions, old tombstones.
CREATE INDEX sessions_by_lease ON sessions (run_expire_time) WHERE run_id <> '' AND deleted = 0;
CREATE INDEX sessions_by_idle ON sessions (deleted, update_time);

ALTER TABLE messages ADD COLUMN redacted INTEGER NOT NULL DEFAULT 0;

-- Per-session key/value state; `version` is the revision that wrote it.
CREATE TABLE session_state (
    session_key  INTEGER NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    key          TEXT    NOT NULL,
    value        TEXT    NOT NULL,
    version      INTEGER NOT NULL,
    update_time  INTEGER NOT NULL,
    PRIMARY KEY (session_key, key)
) WITHOUT ROWID;

-- The searchable text of each current message. The rowid is
-- session_key * 2^32 + sequence, so one session's rows form a rowid range
-- (rollback and delete remove ranges without scanning the index).
CREATE VIRTUAL TABLE message_search USING fts5 (text, tokenize = 'unicode61 remove_diacritics 2');
