-- --search on|off: whether message_search holds every current message.
-- A server started with --search off empties it and sets built = false;
-- one started with --search on builds it again in the background (one
-- replica at a time: `builder` holds the claim until `claim_until`, in
-- microseconds since the epoch, renewed as it goes) and sets built = true.
CREATE TABLE search_index (
    id           INTEGER PRIMARY KEY CHECK (id = 1),
    built        BOOLEAN NOT NULL,
    builder      TEXT    NOT NULL DEFAULT '',
    claim_until  BIGINT  NOT NULL DEFAULT 0
);
INSERT INTO search_index (id, built) VALUES (1, true);
