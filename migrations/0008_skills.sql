-- What a seat learned: a synthesized skill is a reusable procedure the
-- learning duty induced from a seat's successful episodes (or a colleague
-- of its role induced, promoted to the whole role), with every version of
-- its text kept. Both tables ride CREWLET_MEMORY like the rest of a seat's
-- memory, so a skill follows its seat; a role-wide skill is one row per
-- seat of the role (`origin = 'promoted'`), because memory is replayed per
-- seat.

-- One row per skill of a seat: its standing (uses, ageing) and its current
-- version.
CREATE TABLE synthesized_skills (
    seat         TEXT    NOT NULL,
    skill_id     TEXT    NOT NULL,
    name         TEXT    NOT NULL,
    origin       TEXT    NOT NULL CHECK (origin IN ('induced', 'promoted')),
    -- The seats whose induced skill this promoted copy stands for.
    promoted_from TEXT   NOT NULL DEFAULT '[]' CHECK (json_valid(promoted_from)),
    state        TEXT    NOT NULL CHECK (state IN ('active', 'retired')),
    version      INTEGER NOT NULL CHECK (version >= 1),
    uses         INTEGER NOT NULL DEFAULT 0,
    last_used_ms INTEGER,
    created_ms   INTEGER NOT NULL,
    retired_ms   INTEGER,
    updated_ms   INTEGER NOT NULL,
    change_seq   INTEGER NOT NULL UNIQUE,
    PRIMARY KEY (seat, skill_id)
) STRICT;
CREATE INDEX synthesized_skills_state ON synthesized_skills (seat, state);

-- Every version of a skill's procedure, and what it was learned from.
CREATE TABLE synthesized_skill_versions (
    seat        TEXT    NOT NULL,
    skill_id    TEXT    NOT NULL,
    version     INTEGER NOT NULL CHECK (version >= 1),
    procedure   TEXT    NOT NULL,
    -- The episodes (turn ids) the reflection read.
    episodes    TEXT    NOT NULL DEFAULT '[]' CHECK (json_valid(episodes)),
    -- `provider/model` of the reflection that wrote it.
    model       TEXT    NOT NULL,
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL,
    change_seq  INTEGER NOT NULL UNIQUE,
    PRIMARY KEY (seat, skill_id, version)
) STRICT;
