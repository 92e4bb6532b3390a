-- Events are stored in the form WatchSession sends them: `wire` holds the
-- protobuf encoding of the event's `sessionstore.v1.SessionEvent`, so a
-- replay frames what it reads instead of decoding JSON and encoding it
-- again. New events leave `body` empty. Events written before keep their
-- JSON in `body` (and no `wire`); they are read as they are, and a
-- redaction that rewrites one stores it encoded.
--
-- Every replica must run a server that reads `wire` before any writes
-- events this way: an older server cannot read them.
--
-- Adds a column only: no row is read or rewritten. Large encodings are
-- compressed with lz4 where the server has it, as `body` was (0003).
ALTER TABLE events ADD COLUMN wire bytea;

DO $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM pg_settings
        WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)
    ) THEN
        ALTER TABLE events ALTER COLUMN wire SET COMPRESSION lz4;
    END IF;
END
$$;
