-- An appended exchange's event no longer repeats its messages' content:
-- the event row keeps every other field of the `SessionEvent` (the
-- messages' ids and sequences included) and refers to the session's
-- messages `refers_from..refers_until` for their content, which a read
-- puts back. Each message row names the event that refers to it
-- (`referenced_by`, its revision), so that before a message changes
-- (an edit, a redaction, a rollback) that event is written out whole
-- again: a replay still shows what was appended. 0 means none.
--
-- Events written before keep their content and are read as they are.
-- Every replica must run a server that reads these columns before any
-- writes events this way: an older server would read a referring event's
-- messages without their content.
--
-- Adds columns with a constant default only: no row is read or rewritten.
ALTER TABLE events ADD COLUMN refers_from BIGINT NOT NULL DEFAULT 0;
ALTER TABLE events ADD COLUMN refers_until BIGINT NOT NULL DEFAULT 0;
ALTER TABLE messages ADD COLUMN referenced_by BIGINT NOT NULL DEFAULT 0;
