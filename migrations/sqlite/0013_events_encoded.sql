-- Events are stored in the form WatchSession sends them: `wire` holds the
-- protobuf encoding of the event's `sessionstore.v1.SessionEvent`, so a
-- replay frames what it reads instead of decoding JSON and encoding it
-- again. New events leave `body` empty. Events written before keep their
-- JSON in `body` (and no `wire`); they are read as they are, and a
-- redaction that rewrites one stores it encoded.
--
-- Adds a column only: no row is read or rewritten.
ALTER TABLE events ADD COLUMN wire BLOB;
