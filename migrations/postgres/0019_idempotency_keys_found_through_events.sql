-- A session's idempotency keys are found through its events, not through
-- an index of their own: an appended exchange's event records the
-- exchange's request id (`events.request_id`, NULL for every other event
-- and for an exchange sent without one), and deleting a session's history
-- deletes the keys its events name before the events. Every exchange with
-- a request id inserted an entry into `idempotency_keys_by_session`, a
-- B-tree written only for the deletions.
--
-- Keys written before, and any an older server writes, have no such
-- event: they keep `found_through_event = 0` and stay in an index by
-- session of their own, made partial on it, which new keys (1) never
-- enter.
--
-- Adds columns (no row is rewritten) and builds the partial index over
-- the keys there are, in place of the full one. An older replica still
-- running beside the migrated database stays correct (its keys take the
-- default, 0; it deletes a session's keys by `session_key`) but its
-- deletions scan the keys table: upgrade every replica before deleting
-- sessions in bulk.
ALTER TABLE events ADD COLUMN request_id TEXT;
ALTER TABLE idempotency_keys ADD COLUMN found_through_event BIGINT NOT NULL DEFAULT 0;
CREATE INDEX idempotency_keys_without_event_by_session ON idempotency_keys (session_key)
    WHERE found_through_event = 0;
DROP INDEX idempotency_keys_by_session;
