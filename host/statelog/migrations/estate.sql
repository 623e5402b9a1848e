-- The replicated estate (replicated.sqlite3): every data node holds it whole,
-- and only the state log's applier writes it. Each version is one statement
-- list; `crate::db` applies the ones above the file's user_version.

-- Where this node is on each domain's log, and the broker instant of the
-- record at that position (what a restored older copy is caught by).
CREATE TABLE statelog_cursor (
    domain    TEXT    PRIMARY KEY,
    position  INTEGER NOT NULL,
    record_ns INTEGER NOT NULL
);

-- The operation ledger: an operation applied once, whichever retry of its
-- write reached the log. Travels inside a snapshot.
CREATE TABLE statelog_ops (
    domain     TEXT    NOT NULL,
    op_id      TEXT    NOT NULL,
    position   INTEGER NOT NULL,
    applied_ms INTEGER NOT NULL,
    PRIMARY KEY (domain, op_id)
) WITHOUT ROWID;
CREATE INDEX statelog_ops_applied ON statelog_ops (applied_ms);

-- Records this build could not decode (a newer build wrote them): kept
-- whole, never applied half.
CREATE TABLE statelog_ops_lost (
    domain   TEXT    NOT NULL,
    position INTEGER NOT NULL,
    subject  TEXT    NOT NULL,
    reason   TEXT    NOT NULL,
    record   BLOB    NOT NULL,
    PRIMARY KEY (domain, position)
) WITHOUT ROWID;

-- The usage domain (CREWLET_USAGE_LOG): each row is one object's whole
-- cumulative value, replaced by the newer one.
CREATE TABLE usage_tokens (
    node          TEXT    NOT NULL,
    day           TEXT    NOT NULL,
    seat          TEXT    NOT NULL,
    role          TEXT    NOT NULL,
    phase         TEXT    NOT NULL,
    model         TEXT    NOT NULL,
    calls         INTEGER NOT NULL,
    input_tokens  INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    PRIMARY KEY (node, day, seat, phase, model)
) WITHOUT ROWID;
CREATE INDEX usage_tokens_day ON usage_tokens (day);

CREATE TABLE usage_turns (
    node    TEXT    NOT NULL,
    day     TEXT    NOT NULL,
    seat    TEXT    NOT NULL,
    role    TEXT    NOT NULL,
    outcome TEXT    NOT NULL,
    turns   INTEGER NOT NULL,
    PRIMARY KEY (node, day, seat, outcome)
) WITHOUT ROWID;
CREATE INDEX usage_turns_day ON usage_turns (day);

CREATE TABLE usage_schedule_runs (
    node     TEXT    NOT NULL,
    day      TEXT    NOT NULL,
    schedule TEXT    NOT NULL,
    seat     TEXT    NOT NULL,
    fires    INTEGER NOT NULL,
    PRIMARY KEY (node, day, schedule, seat)
) WITHOUT ROWID;
CREATE INDEX usage_schedule_runs_day ON usage_schedule_runs (day);
