-- Fewer index entries written by every AppendExchange. An append updates
-- its session's row (never a HOT update: update_time is in the listing
-- indexes, so every index of the table takes a new entry) and inserts a
-- provider call; each index on either costs an entry per append.
--
-- sessions: `sessions_by_idle` (deleted, update_time) served two sweeps
-- only: deleting sessions idle past the retention age (opt-in), which now
-- reads the listing index one tenant at a time, and purging tombstones
-- an hour old, which gets an index of its own over the tombstones, never
-- written by an append (a deleted session takes none).
--
-- provider_calls: no read looks a call up by its id or by its ordinal
-- alone; they read a session's calls in order (ListProviderCalls, deleting
-- a session) or a tenant's by time (SummarizeUsage). The primary key
-- becomes (session_key, ordinal), the index those reads used, and the
-- unique index on id goes: ids are made by the server (time-ordered
-- UUIDs) and never looked up. Three indexes fewer for an append's rows.
--
-- The new primary key is built over the existing rows (a unique index on
-- two integers): on a large table this migration takes a while and holds
-- appends back until it is done.
DROP INDEX IF EXISTS sessions_by_idle;
CREATE INDEX sessions_tombstones_by_time ON sessions (update_time) WHERE deleted = 1;

ALTER TABLE provider_calls DROP CONSTRAINT IF EXISTS provider_calls_id_key;
ALTER TABLE provider_calls DROP CONSTRAINT provider_calls_pkey;
ALTER TABLE provider_calls ADD CONSTRAINT provider_calls_pkey PRIMARY KEY (session_key, ordinal);
DROP INDEX IF EXISTS provider_calls_by_session;
