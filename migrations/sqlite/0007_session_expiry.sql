-- Per-session expiry: 0 is never. The sweeper finds expired sessions by
-- this index.
ALTER TABLE sessions ADD COLUMN expire_time INTEGER NOT NULL DEFAULT 0;
CREATE INDEX sessions_by_expiry ON sessions (expire_time) WHERE deleted = 0 AND expire_time > 0;
