-- A session's idempotency keys are found through its events, not through
-- an index of their own: an appended exchange's event records the
-- exchange's request id (`events.request_id`, NULL for every other event
-- and for an exchange sent without one), and deleting a session's history
-- deletes the keys its events name before the events. Every exchange with
-- a request id wrote an entry into `idempotency_keys_by_session`, at its
-- session's place in that index: about one page of the WAL per exchange
-- in ten, written only for the deletions.
--
-- Keys written before, and any an older server writes, have no such
-- event: they keep `found_through_event = 0` and stay in an index by
-- session of their own, made partial on it, which new keys (1) never
-- enter.
--
-- The keys table is rebuilt without its foreign key to `sessions`: with
-- foreign keys enforced, deleting a session row looked its keys up by
-- `session_key`, which only a full index can serve. The server deletes
-- them itself, as it does on PostgreSQL (0012).
--
-- Copies every key once; events only gain a column (no row is rewritten).
ALTER TABLE events ADD COLUMN request_id TEXT;

CREATE TABLE idempotency_keys_0019 (
    tenant               TEXT    NOT NULL,
    request_id           TEXT    NOT NULL,
    session_key          INTEGER NOT NULL,
    fingerprint          BLOB    NOT NULL,
    revision             INTEGER NOT NULL,   -- the event holding the first result
    found_through_event  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, request_id)
) WITHOUT ROWID;
INSERT INTO idempotency_keys_0019 (tenant, request_id, session_key, fingerprint, revision)
    SELECT tenant, request_id, session_key, fingerprint, revision FROM idempotency_keys;
DROP TABLE idempotency_keys;
ALTER TABLE idempotency_keys_0019 RENAME TO idempotency_keys;
CREATE INDEX idempotency_keys_without_event_by_session ON idempotency_keys (session_key)
    WHERE found_through_event = 0;
