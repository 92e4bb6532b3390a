-- Queued input (SubmitInput while a session is busy): one row per input,
-- kept with its session (deleted with it). `state`: 0 waiting, 1 taken,
-- 2 withdrawn; taken and withdrawn rows stay, so positions (1, 2, … per
-- session) are never reused. `body` is the input (its messages
-- included), encoded; `end_revision` the revision that took or withdrew it.
--
-- A new table that nothing of the previous release reads or writes: expand.
CREATE TABLE IF NOT EXISTS queued_inputs (
    session_key   BIGINT  NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    input_id      TEXT    NOT NULL,
    position      BIGINT  NOT NULL,
    state         BIGINT  NOT NULL DEFAULT 0,
    body          BYTEA   NOT NULL,
    end_revision  BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (session_key, input_id)
);
CREATE UNIQUE INDEX IF NOT EXISTS queued_inputs_by_position ON queued_inputs (session_key, position);
