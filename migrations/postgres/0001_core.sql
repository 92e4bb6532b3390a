-- sessionstore core schema (PostgreSQL).
--
-- Sessions are addressed inside the database by an internal `key`, never
-- reused; the API's (tenant, id) is unique among live sessions only, so a
-- deleted session's id can be taken again. A deleted session stays as a
-- tombstone row (deleted = 1) holding its final `session_deleted` event, so
-- a watcher that is still replaying sees the deletion in order.

CREATE TABLE sessions (
    key                   BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant                TEXT    NOT NULL,
    id                    TEXT    COLLATE "C" NOT NULL,
    title                 TEXT    NOT NULL,
    system_prompt         TEXT    NOT NULL,
    user_name             TEXT    NOT NULL,
    metadata              TEXT    NOT NULL,   -- JSON object of strings
    summary_message_id    TEXT    NOT NULL DEFAULT '',
    revision              BIGINT  NOT NULL,
    next_sequence         BIGINT  NOT NULL DEFAULT 0,
    message_count         BIGINT  NOT NULL DEFAULT 0,
    provider_call_count   BIGINT  NOT NULL DEFAULT 0,
    last_model            TEXT    NOT NULL DEFAULT '',
    last_provider         TEXT    NOT NULL DEFAULT '',
    last_cost_micros_usd  BIGINT  NOT NULL DEFAULT 0,
    last_request_id       TEXT    NOT NULL DEFAULT '',
    total_tokens          BIGINT  NOT NULL DEFAULT 0,
    total_cost_micros_usd BIGINT  NOT NULL DEFAULT 0,
    create_time           BIGINT  NOT NULL,   -- microseconds since the epoch
    update_time           BIGINT  NOT NULL,
    deleted               BIGINT  NOT NULL DEFAULT 0
);

CREATE UNIQUE INDEX sessions_live_id ON sessions (tenant, id) WHERE deleted = 0;
CREATE INDEX sessions_by_update ON sessions (tenant, update_time DESC, id DESC) WHERE deleted = 0;
CREATE INDEX sessions_by_user_update ON sessions (tenant, user_name, update_time DESC, id DESC) WHERE deleted = 0;

CREATE TABLE provider_calls (
    ordinal             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- insertion order, pages ListProviderCalls
    id                  TEXT    NOT NULL UNIQUE,
    session_key         BIGINT  NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    request_id          TEXT    NOT NULL,
    provider            TEXT    NOT NULL,
    model               TEXT    NOT NULL,
    requested_provider  TEXT    NOT NULL,
    requested_model     TEXT    NOT NULL,
    prompt_tokens       BIGINT  NOT NULL,
    completion_tokens   BIGINT  NOT NULL,
    total_tokens        BIGINT  NOT NULL,
    cost_micros_usd     BIGINT  NOT NULL,
    create_time         BIGINT  NOT NULL
);

CREATE INDEX provider_calls_by_session ON provider_calls (session_key, ordinal);

CREATE TABLE messages (
    session_key          BIGINT  NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    sequence             BIGINT  NOT NULL,
    id                   TEXT    NOT NULL UNIQUE,
    -- NULL when the message was not produced by a provider call, or the call was deleted.
    produced_by_call_id  TEXT    REFERENCES provider_calls (id) ON DELETE SET NULL,
    body                 TEXT    NOT NULL,    -- the Message, JSON-encoded
    create_time          BIGINT  NOT NULL,
    PRIMARY KEY (session_key, sequence)
);

CREATE INDEX messages_by_call ON messages (produced_by_call_id) WHERE produced_by_call_id IS NOT NULL;

-- One row per revision: the session's change history, replayed by WatchSession.
CREATE TABLE events (
    session_key  BIGINT  NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    revision     BIGINT  NOT NULL,
    time         BIGINT  NOT NULL,
    body         TEXT    NOT NULL,            -- the change, JSON-encoded
    PRIMARY KEY (session_key, revision)
);

-- AppendExchange idempotency keys, per tenant, kept as long as their session.
CREATE TABLE idempotency_keys (
    tenant       TEXT    NOT NULL,
    request_id   TEXT    NOT NULL,
    session_key  BIGINT  NOT NULL REFERENCES sessions (key) ON DELETE CASCADE,
    fingerprint  BYTEA   NOT NULL,
    revision     BIGINT  NOT NULL,            -- the event holding the first result
    PRIMARY KEY (tenant, request_id)
);

CREATE INDEX idempotency_keys_by_session ON idempotency_keys (session_key);
