-- A seat's long memory: the notes it keeps (`remember`), one episode per
-- ended turn, who it has dealt with, and whether it has been onboarded.
-- Every row also rides CREWLET_MEMORY (crewlet-memory), so these are this
-- node's copy of the seat's memory; a row replayed from the stream keeps
-- the newer `updated_ms`.
--
-- The one counter every row written here is stamped from (`change_seq`).
-- It only ever increases and never hands a number out twice: a rowid is
-- reused once the newest row is deleted, and a watermark over it would
-- skip the next row written.
CREATE TABLE memory_change_sequence (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL CHECK (last >= 0)
) STRICT;
INSERT INTO memory_change_sequence (id, last) VALUES (1, 0);

-- A vector is little-endian f32 (`embedding`), stored with the model it
-- came from and its dimension: vectors of another model or dimension are
-- never compared. All three or none.

-- Notes a seat wrote with `remember`.
CREATE TABLE agent_diary (
    seat            TEXT    NOT NULL,
    note_id         TEXT    NOT NULL,
    text            TEXT    NOT NULL,
    turn_id         TEXT,
    created_ms      INTEGER NOT NULL,
    updated_ms      INTEGER NOT NULL,
    embedding       BLOB,
    embedding_model TEXT,
    embedding_dim   INTEGER,
    change_seq      INTEGER NOT NULL UNIQUE,
    PRIMARY KEY (seat, note_id),
    CHECK ((embedding IS NULL) = (embedding_model IS NULL)
       AND (embedding IS NULL) = (embedding_dim IS NULL)),
    CHECK (embedding IS NULL OR (embedding_dim > 0 AND length(embedding) = 4 * embedding_dim))
) STRICT;
CREATE INDEX agent_diary_recent ON agent_diary (seat, created_ms);

-- One row per ended turn: what woke it, who asked, what it did, how it
-- ended and what it cost, summarised in a bounded text.
CREATE TABLE episodes (
    seat            TEXT    NOT NULL,
    turn_id         TEXT    NOT NULL,
    conversation    TEXT,
    trigger         TEXT    NOT NULL,
    asked_by        TEXT    NOT NULL DEFAULT '[]' CHECK (json_valid(asked_by)),
    tools           TEXT    NOT NULL DEFAULT '[]' CHECK (json_valid(tools)),
    reply           TEXT,
    outcome         TEXT    NOT NULL,
    input_tokens    INTEGER NOT NULL DEFAULT 0,
    output_tokens   INTEGER NOT NULL DEFAULT 0,
    summary         TEXT    NOT NULL,
    ended_ms        INTEGER NOT NULL,
    updated_ms      INTEGER NOT NULL,
    embedding       BLOB,
    embedding_model TEXT,
    embedding_dim   INTEGER,
    change_seq      INTEGER NOT NULL UNIQUE,
    PRIMARY KEY (seat, turn_id),
    CHECK ((embedding IS NULL) = (embedding_model IS NULL)
       AND (embedding IS NULL) = (embedding_dim IS NULL)),
    CHECK (embedding IS NULL OR (embedding_dim > 0 AND length(embedding) = 4 * embedding_dim))
) STRICT;
CREATE INDEX episodes_recent ON episodes (seat, ended_ms);

-- Who a seat has dealt with (a sender's identity), and what it knows of
-- them (bounded).
CREATE TABLE counterparty_profiles (
    seat         TEXT    NOT NULL,
    counterparty TEXT    NOT NULL,
    known        TEXT    NOT NULL,
    turns        INTEGER NOT NULL DEFAULT 0,
    first_ms     INTEGER NOT NULL,
    last_ms      INTEGER NOT NULL,
    updated_ms   INTEGER NOT NULL,
    change_seq   INTEGER NOT NULL UNIQUE,
    PRIMARY KEY (seat, counterparty)
) STRICT;

-- A seat has had its first turn in the company: the onboarding block is
-- rendered once per seat, fleet-wide (the row rides the stream).
CREATE TABLE agent_onboarding_markers (
    seat         TEXT    PRIMARY KEY,
    turn_id      TEXT    NOT NULL,
    onboarded_ms INTEGER NOT NULL,
    updated_ms   INTEGER NOT NULL,
    change_seq   INTEGER NOT NULL UNIQUE
) STRICT;
