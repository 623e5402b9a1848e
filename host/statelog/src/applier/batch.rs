//! One batch: records taken off the log and decoded on the reader's side,
//! then written in one transaction with the ledger and the cursor.

use async_nats::jetstream;
use rusqlite::params;

use super::PassEnd;
use crate::EstateError;
use crate::domain::{Change, Domain, Writes};
use crate::estate::{Cursor, Estate};
use crate::record::{BARRIER_KIND, Incoming, Undecodable, op_floor};

/// A record as it arrived, decoded on the reader's side. Only a record
/// kept undecoded holds on to its message's bytes: the rest are freed on
/// the reader's thread, where they were made.
pub(super) struct Arrived {
    pub(super) seq: u64,
    pub(super) ns: i64,
    pub(super) read: Read,
}

/// What a record is, as the reader decoded it.
pub(super) enum Read {
    Barrier,
    Change {
        op: uuid::Uuid,
        change: Box<dyn Change>,
    },
    Undecodable {
        why: Undecodable,
        subject: async_nats::Subject,
        payload: bytes::Bytes,
    },
}

impl Read {
    fn of(domain: &dyn Domain, m: &async_nats::Message) -> Read {
        let undecodable = |why| Read::Undecodable {
            why,
            subject: m.subject.clone(),
            payload: m.payload.clone(),
        };
        let record = match Incoming::decode(m.payload.clone()) {
            Ok(r) => r,
            Err(u) => return undecodable(u),
        };
        if record.kind == BARRIER_KIND {
            return Read::Barrier;
        }
        match domain.decode(&record) {
            Ok(change) => Read::Change {
                op: record.op,
                change,
            },
            Err(u) => undecodable(u),
        }
    }
}

/// Takes one message off the log into `next`; answers whether the reader
/// was made again before it (its delivery count restarted).
pub(super) fn arrive<E: std::fmt::Display>(
    domain: &dyn Domain,
    m: Option<Result<jetstream::Message, E>>,
    delivered: &mut u64,
    next: &mut Vec<Arrived>,
) -> Result<bool, PassEnd> {
    let Some(m) = m else {
        return Err(PassEnd::Unavailable("the log's reader ended".into()));
    };
    let m = m.map_err(|e| PassEnd::Unavailable(format!("reading the log: {e}")))?;
    let info = m
        .info()
        .map_err(|e| PassEnd::Unavailable(format!("a message without its position: {e}")))?;
    let reset = info.consumer_sequence != *delivered + 1;
    *delivered = info.consumer_sequence;
    next.push(Arrived {
        seq: info.stream_sequence,
        ns: info.published.unix_timestamp_nanos() as i64,
        read: Read::of(domain, &m),
    });
    Ok(reset)
}

static LEDGER: &str = "INSERT OR IGNORE INTO statelog_ops (domain, op_id, position, applied_ms)
 VALUES (?1, ?2, ?3, ?4)";
static KEEP_LOST: &str =
    "INSERT OR IGNORE INTO statelog_ops_lost (domain, position, subject, reason, record)
 VALUES (?1, ?2, ?3, ?4, ?5)";

/// Applies one batch in one transaction; answers the new cursor and how
/// many records were kept undecoded.
pub(super) fn apply(
    estate: &Estate,
    domain: &dyn Domain,
    cursor: Cursor,
    batch: &[Arrived],
    age_out: bool,
) -> Result<(Cursor, u64), EstateError> {
    let name = domain.name();
    let now = crewlet_os::now_ms();
    estate.write(|tx| {
        let mut at = cursor;
        let mut lost = 0;
        let mut w = Writes::new(tx);
        for a in batch {
            if a.seq <= at.position {
                continue;
            }
            match &a.read {
                Read::Undecodable {
                    why,
                    subject,
                    payload,
                } => {
                    w.statement(KEEP_LOST)?.execute(params![
                        name,
                        a.seq as i64,
                        subject.as_str(),
                        &why.0,
                        &payload[..]
                    ])?;
                    lost += 1;
                }
                Read::Barrier => {}
                Read::Change { op, change } => {
                    // The ledger row first: a retried operation's insert
                    // is ignored, and the record is stepped over.
                    let fresh = w.statement(LEDGER)?.execute(params![
                        name,
                        op.as_bytes().as_slice(),
                        a.seq as i64,
                        now
                    ])? == 1;
                    if fresh {
                        change.write(&mut w)?;
                    }
                }
            }
            at = Cursor {
                position: a.seq,
                record_ns: a.ns,
            };
        }
        drop(w);
        tx.execute(
            "INSERT OR REPLACE INTO statelog_cursor (domain, position, record_ns) VALUES (?1, ?2, ?3)",
            params![name, at.position as i64, at.record_ns],
        )?;
        if age_out {
            domain.age_out(tx, now)?;
            if let Some(age) = domain.max_age() {
                tx.execute(
                    "DELETE FROM statelog_ops WHERE domain = ?1 AND op_id < ?2",
                    params![
                        name,
                        op_floor(now - age.as_millis() as i64).as_bytes().as_slice()
                    ],
                )?;
            }
        }
        Ok((at, lost))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::Usage;

    #[test]
    fn the_ledger_ages_out_operations_made_before_the_horizon_by_their_ids() {
        let dir = tempfile::tempdir().unwrap();
        let estate = Estate::open_in(dir.path()).unwrap();
        let now = crewlet_os::now_ms();
        let day = 24 * 3600 * 1000;
        let horizon = Usage.max_age().unwrap().as_millis() as i64;
        // An id made just after `ms`: its floor with a later random part.
        let made_at = |ms: i64| {
            let mut id = *op_floor(ms).as_bytes();
            id[6..].copy_from_slice(&[0x7a, 0xbc, 0x8d, 0xef, 1, 2, 3, 4, 5, 6]);
            id.to_vec()
        };
        let (old, kept) = (made_at(now - horizon - day), made_at(now - horizon + day));
        estate
            .write(|tx| {
                for (op, position) in [(&old, 1), (&kept, 2)] {
                    tx.execute(
                        "INSERT INTO statelog_ops (domain, op_id, position, applied_ms) VALUES ('usage', ?1, ?2, 0)",
                        params![op, position],
                    )?;
                }
                Ok(())
            })
            .unwrap();
        let barrier = Arrived {
            seq: 3,
            ns: 1,
            read: Read::Barrier,
        };
        let (at, lost) = apply(&estate, &Usage, Cursor::default(), &[barrier], true).unwrap();
        assert_eq!((at.position, lost), (3, 0));
        let ops: Vec<Vec<u8>> = estate
            .reader()
            .unwrap()
            .prepare("SELECT op_id FROM statelog_ops ORDER BY position")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(ops, [kept]);
    }
}
