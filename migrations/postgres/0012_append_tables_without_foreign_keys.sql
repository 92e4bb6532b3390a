-- The tables every AppendExchange writes keep no foreign keys. Each check
-- was a query PostgreSQL ran per inserted row (a row lock on the session
-- included): nine per exchange of two messages, about 5% of the
-- database's CPU under appends. They could never fail: an append locks
-- its session row, checks that it is live and writes the provider call
-- its messages name in the same statement. Every path that deletes a
-- session or a provider call deletes these rows itself (messages before
-- their calls), so nothing relied on the cascades any more.
--
-- The index on messages.produced_by_call_id served only the foreign key's
-- ON DELETE SET NULL; no read uses it.
--
-- Catalog changes only: no row is read or rewritten.
ALTER TABLE messages DROP CONSTRAINT IF EXISTS messages_session_key_fkey;
ALTER TABLE messages DROP CONSTRAINT IF EXISTS messages_produced_by_call_id_fkey;
DROP INDEX IF EXISTS messages_by_call;
ALTER TABLE provider_calls DROP CONSTRAINT IF EXISTS provider_calls_session_key_fkey;
ALTER TABLE events DROP CONSTRAINT IF EXISTS events_session_key_fkey;
ALTER TABLE idempotency_keys DROP CONSTRAINT IF EXISTS idempotency_keys_session_key_fkey;
ALTER TABLE message_search DROP CONSTRAINT IF EXISTS message_search_session_key_fkey;
