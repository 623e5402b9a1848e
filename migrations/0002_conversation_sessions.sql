-- What a seat already said in one conversation (a thread, an issue), so a
-- turn woken there starts from it rather than from nothing.
CREATE TABLE conversation_sessions (
    seat         TEXT    NOT NULL,
    conversation TEXT    NOT NULL,
    created_ms   INTEGER NOT NULL,
    updated_ms   INTEGER NOT NULL,
    turns        INTEGER NOT NULL DEFAULT 0,
    said         TEXT    NOT NULL DEFAULT '[]' CHECK (json_valid(said)),
    PRIMARY KEY (seat, conversation)
) WITHOUT ROWID;
CREATE INDEX conversation_sessions_updated ON conversation_sessions (updated_ms);
