-- Version 4 of the estate: the operation ledger keeps an operation id as
-- its 16 bytes, not its 36 characters of text (BENCHMARKS.md, "The
-- replicated estate": every applied record inserts one ledger row). A
-- UUIDv7's bytes sort by time as its text did, so the age-out's range is
-- unchanged. An id that is not a UUID cannot recur (such a record is now
-- kept undecoded), so its row is not carried over.
CREATE TABLE statelog_ops_v4 (
    domain     TEXT    NOT NULL,
    op_id      BLOB    NOT NULL,
    position   INTEGER NOT NULL,
    applied_ms INTEGER NOT NULL,
    PRIMARY KEY (domain, op_id)
) WITHOUT ROWID;
INSERT OR IGNORE INTO statelog_ops_v4 (domain, op_id, position, applied_ms)
    SELECT domain, unhex(op_id, '-'), position, applied_ms
      FROM statelog_ops
     WHERE length(op_id) = 36 AND length(unhex(op_id, '-')) = 16;
DROP TABLE statelog_ops;
ALTER TABLE statelog_ops_v4 RENAME TO statelog_ops;
