-- This node's own observations of the logs (statelog-local.sqlite3): never
-- replicated, never inside a snapshot, so an adoption keeps them.

-- What this node last saw of each stream's identity (its creation instant):
-- a stream recreated underneath the node shows a different one.
CREATE TABLE stream_identity (
    stream   TEXT PRIMARY KEY,
    identity TEXT NOT NULL,
    seen_ms  INTEGER NOT NULL
);

-- A log found diverged from this node's rows; while a row stands the
-- domain's applier applies nothing.
CREATE TABLE statelog_diverged (
    domain    TEXT    PRIMARY KEY,
    stream    TEXT    NOT NULL,
    position  INTEGER NOT NULL,
    found     TEXT    NOT NULL,
    found_ms  INTEGER NOT NULL
);

-- The peer snapshots this node adopted.
CREATE TABLE statelog_adoption (
    id          INTEGER PRIMARY KEY,
    donor       TEXT    NOT NULL,
    sha256      TEXT    NOT NULL,
    bytes       INTEGER NOT NULL,
    positions   TEXT    NOT NULL,
    began_ms    INTEGER NOT NULL,
    ended_ms    INTEGER,
    outcome     TEXT    NOT NULL
);
