-- message_search keeps each message's words (the tsvector the server
-- computes with to_tsvector('simple', …) as it inserts the row) and no
-- longer a copy of its searchable text: the text is in the message's body,
-- and a hit's snippet is cut from there. The copy was a quarter of the
-- table's bytes for messages of ~500 bytes, written on every append.
-- Both statements change the catalog only: no row is rewritten.
ALTER TABLE message_search ALTER COLUMN words DROP EXPRESSION;
ALTER TABLE message_search DROP COLUMN text;
