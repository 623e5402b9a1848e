-- The log is read newest first (`ORDER BY seq DESC`) by type, seat, trace or
-- party, and written on every webhook's path: each index here is a page
-- written per commit, so the log keeps exactly the ones its reads use.
-- `seq` is the rowid, so an index on (type) is ordered by (type, seq).
DROP INDEX events_at;
DROP INDEX events_type_at;
CREATE INDEX events_type ON events (type);
CREATE INDEX events_seat ON events (seat) WHERE seat IS NOT NULL;

-- Each row carries its parties as written (a JSON array), so reading a page
-- of the log is one scan rather than one lookup per row; `event_parties`
-- stays the index behind "events of this party".
-- (Written only by `append_in`, from serde: no CHECK re-parses it per row.)
ALTER TABLE events ADD COLUMN parties TEXT NOT NULL DEFAULT '[]';
CREATE INDEX migrate_event_parties_seq ON event_parties (seq);
UPDATE events SET parties = (
    SELECT json_group_array(json_object('party', p.party, 'role', p.role))
      FROM (SELECT party, role FROM event_parties WHERE seq = events.seq ORDER BY party, role) p
);
DROP INDEX migrate_event_parties_seq;
