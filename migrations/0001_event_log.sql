-- The event log: every event this node published, written inline by the
-- publisher (no consumer group, so no two nodes ever write one row).
CREATE TABLE events (
    seq          INTEGER PRIMARY KEY,
    event_id     TEXT    NOT NULL UNIQUE,
    type         TEXT    NOT NULL,
    at_ms        INTEGER NOT NULL,
    node_id      TEXT    NOT NULL,
    trace_id     TEXT,
    seat         TEXT,
    conversation TEXT,
    payload      TEXT    NOT NULL CHECK (json_valid(payload))
);
CREATE INDEX events_at ON events (at_ms);
CREATE INDEX events_type_at ON events (type, at_ms);
CREATE INDEX events_trace ON events (trace_id) WHERE trace_id IS NOT NULL;

-- Who an event concerns (the seat it woke, the people it mentions, the
-- author): the index behind "events of this party".
CREATE TABLE event_parties (
    party TEXT    NOT NULL,
    role  TEXT    NOT NULL,
    seq   INTEGER NOT NULL REFERENCES events (seq) ON DELETE CASCADE,
    PRIMARY KEY (party, seq, role)
) WITHOUT ROWID;
