-- Rows over ~2 KB (an exchange's event, a long message, a search row with
-- its tsvector) are compressed for TOAST as they are written. pglz took
-- 8.5% of PostgreSQL's CPU in an append benchmark; lz4 compresses several
-- times faster. Existing values stay as they are; servers built without
-- lz4 keep pglz.
DO $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM pg_settings
        WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)
    ) THEN
        ALTER TABLE events ALTER COLUMN body SET COMPRESSION lz4;
        ALTER TABLE messages ALTER COLUMN body SET COMPRESSION lz4;
        ALTER TABLE message_search ALTER COLUMN text SET COMPRESSION lz4;
        ALTER TABLE message_search ALTER COLUMN words SET COMPRESSION lz4;
    END IF;
END
$$;
