-- Every append moves its session's update_time, and each index holding
-- update_time takes an entry out and puts one in. `sessions_by_idle`
-- (deleted, update_time) was the third such index, there only for two
-- sweeps: deleting sessions idle past the retention age (opt-in) and
-- purging tombstones an hour old. The idle sweep now reads the listing
-- index (tenant, update_time DESC, id DESC) one tenant at a time; the
-- tombstones get an index of their own, which appends never write (a
-- tombstone takes no appends).
--
-- Catalog changes and one index built over the tombstones only.
DROP INDEX IF EXISTS sessions_by_idle;
CREATE INDEX sessions_tombstones_by_time ON sessions (update_time) WHERE deleted = 1;
