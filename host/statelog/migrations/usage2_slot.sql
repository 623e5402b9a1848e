-- Version 2 of the estate: tokens by provider slot too (the chain's entry
-- and the pool's key that served the calls). A row an older build's record
-- wrote has slot '' — the record did not say, read as unknown, never as a
-- slot; the primary key takes the slot, so the table is rebuilt.
CREATE TABLE usage_tokens_v2 (
    node          TEXT    NOT NULL,
    day           TEXT    NOT NULL,
    seat          TEXT    NOT NULL,
    role          TEXT    NOT NULL,
    phase         TEXT    NOT NULL,
    model         TEXT    NOT NULL,
    slot          TEXT    NOT NULL DEFAULT '',
    calls         INTEGER NOT NULL,
    input_tokens  INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    PRIMARY KEY (node, day, seat, phase, model, slot)
) WITHOUT ROWID;
INSERT INTO usage_tokens_v2
    (node, day, seat, role, phase, model, slot, calls, input_tokens, output_tokens)
    SELECT node, day, seat, role, phase, model, '', calls, input_tokens, output_tokens
      FROM usage_tokens;
DROP TABLE usage_tokens;
ALTER TABLE usage_tokens_v2 RENAME TO usage_tokens;
CREATE INDEX usage_tokens_day ON usage_tokens (day);
