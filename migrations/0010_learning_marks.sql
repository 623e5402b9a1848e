-- The learning duty's reflection watermark: per seat, the newest episode
-- (its `ended_ms`) a reflection has read. It rides CREWLET_MEMORY like the
-- rest of a seat's memory, so a new holder of the duty goes on from where
-- the last one stopped instead of reflecting again over the same episodes.
-- It only moves forward: a replayed mark lower than this node's is kept
-- out.
CREATE TABLE learning_marks (
    seat         TEXT    NOT NULL PRIMARY KEY,
    reflected_ms INTEGER NOT NULL,
    updated_ms   INTEGER NOT NULL,
    change_seq   INTEGER NOT NULL UNIQUE
) STRICT;
