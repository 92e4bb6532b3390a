-- Live runs: which runs CancelRun asked to stop, and at which revision, so
-- a later PublishDelta answers cancel_requested and a repeated CancelRun
-- answers the first one's revision without writing.
CREATE TABLE run_cancels (
    session_key  INTEGER NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    run_id       TEXT    NOT NULL,
    revision     INTEGER NOT NULL,
    PRIMARY KEY (session_key, run_id)
) WITHOUT ROWID;
