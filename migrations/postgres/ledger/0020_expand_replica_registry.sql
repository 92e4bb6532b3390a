-- The replica registry: every `sessionstore serve` keeps a row here while
-- it runs (inserted before it serves, its heartbeat_time renewed every two
-- seconds by the database's clock, deleted on a clean shutdown). A row
-- whose heartbeat is 20 s old or more is stale and ignored: its replica is
-- gone. `sessionstore replicas` lists the live ones, and `sessionstore
-- migrate --finalize` refuses while one of them runs a schema below its own.
--
-- A new table that nothing of the previous release reads or writes: expand.
CREATE TABLE IF NOT EXISTS sessionstore_replicas (
    replica_id      TEXT        PRIMARY KEY,
    version         TEXT        NOT NULL,
    schema          BIGINT      NOT NULL,
    address         TEXT        NOT NULL,
    start_time      TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_time  TIMESTAMPTZ NOT NULL DEFAULT now()
);
