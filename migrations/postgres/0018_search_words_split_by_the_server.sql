-- Each message's words are split by the server (runs of letters and
-- digits, lowercased, with their positions: as SQLite's index and the
-- search snippets split them) and sent as a `tsvector`; queries are split
-- the same way. PostgreSQL's own parser, which `to_tsvector('simple', …)`
-- used, kept an e-mail address, a URL, a path or a hyphenated word whole
-- as well, so rows it wrote would not be found by the parts of such words.
--
-- The index is emptied and marked unbuilt: the first server started with
-- search on builds it again in the background, from the messages, as after
-- switching search on (`--search on`); searches wait for it meanwhile, and
-- answer UNAVAILABLE (SEARCH_INDEX_BEHIND) if it takes longer than their
-- wait. Every replica must run a server that splits words itself before
-- any indexes messages again.
TRUNCATE message_search;
UPDATE search_index SET built = false, builder = '', claim_until = 0;
