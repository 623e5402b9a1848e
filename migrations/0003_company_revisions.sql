-- Company documents this node has seen, by revision. The fleet agrees on
-- which one is active through the config pointer; this is the node's copy.
CREATE TABLE company_revisions (
    revision    INTEGER PRIMARY KEY,
    digest      TEXT    NOT NULL,
    document    TEXT    NOT NULL,
    imported_ms INTEGER NOT NULL,
    source      TEXT,
    active      INTEGER NOT NULL DEFAULT 0 CHECK (active IN (0, 1))
);
CREATE UNIQUE INDEX company_revisions_one_active ON company_revisions (active) WHERE active = 1;
