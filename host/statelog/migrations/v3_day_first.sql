-- Version 3 of the estate: fewer B-trees written per record (BENCHMARKS.md,
-- "The replicated estate"). The usage tables are keyed day first: every
-- read of them is a day range (`/usage`, the age-out), which the key now
-- serves itself, so the per-table `day` index goes (in a WITHOUT ROWID
-- table such an index repeats the whole key). The ledger's `applied_ms`
-- index goes too: an operation id is a UUIDv7, time first, so the ledger
-- ages out by a range of its own key.
DROP INDEX statelog_ops_applied;

CREATE TABLE usage_tokens_v3 (
    day           TEXT    NOT NULL,
    node          TEXT    NOT NULL,
    seat          TEXT    NOT NULL,
    role          TEXT    NOT NULL,
    phase         TEXT    NOT NULL,
    model         TEXT    NOT NULL,
    slot          TEXT    NOT NULL DEFAULT '',
    calls         INTEGER NOT NULL,
    input_tokens  INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    PRIMARY KEY (day, node, seat, phase, model, slot)
) WITHOUT ROWID;
INSERT INTO usage_tokens_v3
    (day, node, seat, role, phase, model, slot, calls, input_tokens, output_tokens)
    SELECT day, node, seat, role, phase, model, slot, calls, input_tokens, output_tokens
      FROM usage_tokens;
DROP TABLE usage_tokens;
ALTER TABLE usage_tokens_v3 RENAME TO usage_tokens;

CREATE TABLE usage_turns_v3 (
    day     TEXT    NOT NULL,
    node    TEXT    NOT NULL,
    seat    TEXT    NOT NULL,
    role    TEXT    NOT NULL,
    outcome TEXT    NOT NULL,
    turns   INTEGER NOT NULL,
    PRIMARY KEY (day, node, seat, outcome)
) WITHOUT ROWID;
INSERT INTO usage_turns_v3 (day, node, seat, role, outcome, turns)
    SELECT day, node, seat, role, outcome, turns FROM usage_turns;
DROP TABLE usage_turns;
ALTER TABLE usage_turns_v3 RENAME TO usage_turns;

CREATE TABLE usage_schedule_runs_v3 (
    day      TEXT    NOT NULL,
    node     TEXT    NOT NULL,
    schedule TEXT    NOT NULL,
    seat     TEXT    NOT NULL,
    fires    INTEGER NOT NULL,
    PRIMARY KEY (day, node, schedule, seat)
) WITHOUT ROWID;
INSERT INTO usage_schedule_runs_v3 (day, node, schedule, seat, fires)
    SELECT day, node, schedule, seat, fires FROM usage_schedule_runs;
DROP TABLE usage_schedule_runs;
ALTER TABLE usage_schedule_runs_v3 RENAME TO usage_schedule_runs;
