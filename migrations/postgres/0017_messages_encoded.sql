-- Messages are stored in the form the API sends them: `wire` holds the
-- protobuf encoding of the message's `sessionstore.v1.Message`, so a
-- read decodes it with no JSON in between, and an event's replay puts
-- the content of the messages it refers to (0016) back as it is. New
-- rows leave `body` empty. Messages written before keep their JSON in
-- `body` (and no `wire`); they are read as they are, and an edit or a
-- redaction that rewrites one stores it encoded.
--
-- Every replica must run a server that reads `wire` before any writes
-- messages this way: an older server cannot read them.
--
-- Adds a column only: no row is read or rewritten. Large encodings are
-- compressed with lz4 where the server has it, as `body` was (0003).
ALTER TABLE messages ADD COLUMN wire bytea;

DO $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM pg_settings
        WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)
    ) THEN
        ALTER TABLE messages ALTER COLUMN wire SET COMPRESSION lz4;
    END IF;
END
$$;
