-- Runs of scheduled work this node performed: one row per fire, keyed by
-- the fire's fleet-wide key so a fire is never run twice here.
CREATE TABLE scheduled_runs (
    id          INTEGER PRIMARY KEY,
    fire_key    TEXT    NOT NULL UNIQUE,
    schedule    TEXT    NOT NULL,
    seat        TEXT,
    due_ms      INTEGER NOT NULL,
    started_ms  INTEGER,
    finished_ms INTEGER,
    status      TEXT    NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'running', 'done', 'failed', 'skipped')),
    error       TEXT
);
CREATE INDEX scheduled_runs_due ON scheduled_runs (due_ms);
