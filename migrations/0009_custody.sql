-- Custody: a data node keeps the event batches of nodes without `data`.
-- A kept row names the batch it came in (`custody_batch`), so a batch
-- another data node turned out to keep is deleted whole; the node's own
-- rows have none.
ALTER TABLE events ADD COLUMN custody_batch TEXT;
CREATE INDEX events_custody_batch ON events (custody_batch) WHERE custody_batch IS NOT NULL;

-- The batches this node wrote and has not yet learned whether it keeps:
-- written in the transaction that writes the rows, removed once the
-- `custody` bucket answered. A node that crashed between the two settles
-- them at its next pass. Empty but for the batches of the last moments.
CREATE TABLE custody_unsettled (
    batch      TEXT    PRIMARY KEY,
    origin     TEXT    NOT NULL,
    events     INTEGER NOT NULL,
    written_ms INTEGER NOT NULL
) WITHOUT ROWID;
