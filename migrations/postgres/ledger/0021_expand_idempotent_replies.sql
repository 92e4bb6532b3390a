-- Idempotency keys of calls other than AppendExchange (CreateSession,
-- RollbackSession) keep the first answer the event log cannot give back:
-- a rollback's removed messages, encoded. NULL for every other key, and
-- for every key an older release writes.
--
-- A new nullable column that the previous release neither reads nor
-- writes (its inserts name their columns): expand.
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS reply BYTEA;
