-- Conversation control (PostgreSQL): forks, run leases, redaction,
-- per-session state, full-text search, and the indexes the background
-- sweeper uses.

ALTER TABLE sessions ADD COLUMN parent_session_id TEXT   NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN parent_sequence   BIGINT NOT NULL DEFAULT 0;
-- The run holding the session's lease ('' when free) and when it runs out.
ALTER TABLE sessions ADD COLUMN run_id            TEXT   NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN run_expire_time   BIGINT NOT NULL DEFAULT 0;

-- The sweeper: expired leases, idle live sessions, old tombstones.
CREATE INDEX sessions_by_lease ON sessions (run_expire_time) WHERE run_id <> '' AND deleted = 0;
CREATE INDEX sessions_by_idle ON sessions (deleted, update_time);

ALTER TABLE messages ADD COLUMN redacted BIGINT NOT NULL DEFAULT 0;

-- Per-session key/value state; `version` is the revision that wrote it.
CREATE TABLE session_state (
    session_key  BIGINT NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    key          TEXT   COLLATE "C" NOT NULL,
    value        TEXT   NOT NULL,
    version      BIGINT NOT NULL,
    update_time  BIGINT NOT NULL,
    PRIMARY KEY (session_key, key)
);

-- The searchable text of each current message ('simple': case-folded
-- words, no stemming, like SQLite's unicode61).
CREATE TABLE message_search (
    session_key  BIGINT NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    sequence     BIGINT NOT NULL,
    text         TEXT   NOT NULL,
    words        TSVECTOR GENERATED ALWAYS AS (to_tsvector('simple', text)) STORED,
    PRIMARY KEY (session_key, sequence)
);

CREATE INDEX message_search_words ON message_search USING GIN (words);

-- PublishDelta payloads too large for a NOTIFY, read by the other replicas
-- and swept after a few minutes.
CREATE UNLOGGED TABLE delta_spill (
    id    BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    body  TEXT   NOT NULL,
    time  BIGINT NOT NULL
);
