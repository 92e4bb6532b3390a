-- Framework integration (SQLite): shared state scopes, and the session
-- metadata index ListSessions' filter reads.

-- State entries of a shared scope (`app:weather`, `user:weather:alice`)
-- of a tenant, tied to no session; `version` counts the entry's own writes.
CREATE TABLE shared_state (
    tenant       TEXT    NOT NULL,
    scope        TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    value        TEXT    NOT NULL,
    version      INTEGER NOT NULL,
    update_time  INTEGER NOT NULL,
    PRIMARY KEY (tenant, scope, key)
) WITHOUT ROWID;

-- Each live session's metadata entries, one row each (escaped as every
-- TEXT column is), so a `metadata.KEY = "…"` filter is an index lookup.
CREATE TABLE session_metadata (
    session_key  INTEGER NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    tenant       TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    value        TEXT    NOT NULL,
    PRIMARY KEY (session_key, key)
) WITHOUT ROWID;
CREATE INDEX session_metadata_by_value ON session_metadata (tenant, key, value);

-- json_each cuts a string at U+0000: metadata holding one is left out of
-- the backfill, and found by the filter once the session is updated.
INSERT INTO session_metadata (session_key, tenant, key, value)
SELECT s.key, s.tenant, replace(j.key, '\', '\\'), replace(j.value, '\', '\\')
FROM sessions s, json_each(s.metadata) j
WHERE s.deleted = 0 AND instr(s.metadata, '\u0000') = 0;
