-- Secrets set with `crewlet secrets set --data-dir` while the node was
-- stopped. Each row is a sealed record (an envelope under the keyring, as
-- JSON, the very bytes the secrets bucket will hold): never plaintext. The
-- node moves every row onto the fleet's bucket at its next start and then
-- deletes it, so a row lives only as long as the node is down.
CREATE TABLE pending_secrets (
    name       TEXT PRIMARY KEY,
    record     TEXT NOT NULL,
    set_ms     INTEGER NOT NULL
) STRICT;
