//! Custody: which data node keeps each batch of a stateless node's events.
//!
//! Rules, and why:
//! - **Claimed after the write, create-only.** A data node writes a batch
//!   into its event log first and then claims it here; the first claim
//!   stands and every other writer deletes its copy. Claimed after, because
//!   a claimant that died before writing would hold a batch nobody has.
//! - **Company-wide.** The two writers of one batch are different nodes,
//!   so no node's own file can decide between them.
//! - **32 days** ([`crate::bucket::CUSTODY_AGE`]): past the event log's
//!   retention, so a node settling a batch after a crash finds the answer
//!   while a row of it can still be in its log.
//! - **Unknown is not "nobody keeps it".** A claim the store did not answer
//!   is [`CoordError::Unavailable`]: the writer leaves its rows unsettled
//!   and asks again at its next pass, never deletes them.

use serde::{Deserialize, Serialize};

use crate::answer::{Answer, CoordError, Reply};
use crate::bucket::Bucket;
use crate::names::{MAX_KEY_LEN, encode_token, preview};
use crate::records::ms;
use crate::{Coord, decode, encode};

/// The custody contract ([`Coord::custody`]).
#[derive(Clone)]
pub struct Custody {
    coord: Coord,
}

impl Coord {
    /// Which data node keeps each custody batch.
    pub fn custody(&self) -> Custody {
        Custody {
            coord: self.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Kept {
    keeper: String,
    at_ms: u64,
}

impl Custody {
    const B: Bucket = Bucket::Custody;

    /// Claims `batch` for `keeper` (a node id), create-only. Yes: `keeper`
    /// keeps it (a repeated claim by the same keeper is a yes). No: another
    /// data node keeps it, named. Unknown: the store did not answer.
    ///
    /// Safe direction: on unknown keep the rows and ask again — deleting
    /// them could leave a batch no node keeps.
    pub async fn claim(&self, batch: &str, keeper: &str) -> Reply<(), String> {
        let key = encode_token(batch);
        if batch.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(CoordError::InvalidName {
                name: preview(batch),
                why: "a custody batch id is non-empty and fits a key once encoded",
            });
        }
        let b = Self::B;
        let record = Kept {
            keeper: keeper.to_owned(),
            at_ms: ms(self.coord.kv(b).now()),
        };
        Ok(
            match self.coord.create(b, &key, encode(&record), None).await? {
                Ok(_) => Answer::Yes(()),
                Err(entry) => {
                    let kept: Kept = decode(b, &entry)?;
                    if kept.keeper == keeper {
                        Answer::Yes(())
                    } else {
                        Answer::No(kept.keeper)
                    }
                }
            },
        )
    }
}
