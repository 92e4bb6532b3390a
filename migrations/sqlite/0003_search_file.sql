-- The search index moves to a database file of its own (`<database>-search`),
-- written by a thread of its own (server/src/store/sqlite_search.rs). Writes
-- record here which message ranges changed; that thread re-indexes each range
-- from the messages as they then are, and rebuilds the whole index when its
-- file is new (as after this migration).
DROP TABLE main.message_search;

CREATE TABLE search_log (
    id             INTEGER PRIMARY KEY,
    session_key    INTEGER NOT NULL,
    from_sequence  INTEGER NOT NULL,
    until_sequence INTEGER NOT NULL
);
