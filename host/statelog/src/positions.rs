//! The `positions` bucket's state-log classes: where each node stands per
//! domain, the pins a backup or a joining node holds, the nodes an
//! operator evicted, and the floor the trim published.
//!
//! Rule: nothing here ages (the bucket has no age). A node stops holding
//! the trim back only by an operator's audited eviction, never by a clock:
//! an expired position would read as a node that applied nothing. The one
//! exception is a pin taken with a lapse ([`PositionBook::pin_until`], a
//! backup's): a backup that crashed before unpinning must not hold the
//! trim for ever, and a pin past its lapse is no longer counted. Every
//! read is three-valued — a listing the store could not certify is an
//! error, never an empty answer.

use std::collections::BTreeMap;

use crewlet_coord::{Answer, Bucket, Coord, CoordError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

const POSITION: &str = "statelog_position";
const PIN: &str = "statelog_pin";
const EVICTED: &str = "statelog_evicted";
const FLOOR: &str = "statelog_floor";

/// An operator's eviction of a node gone for good.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Eviction {
    pub node: String,
    /// Who evicted it (the operator's token name, or the CLI's user).
    pub by: String,
    pub reason: String,
    pub at_ms: i64,
}

/// The state log's records in the positions bucket.
#[derive(Clone)]
pub struct PositionBook {
    coord: Coord,
}

fn u(v: &Value, field: &str) -> u64 {
    v.get(field).and_then(Value::as_u64).unwrap_or(0)
}

impl PositionBook {
    pub fn new(coord: Coord) -> PositionBook {
        PositionBook { coord }
    }

    async fn put(&self, class: &str, id: &str, value: &Value) -> Result<(), CoordError> {
        self.coord
            .put_record(Bucket::Positions, class, id, value)
            .await
            .map(|_| ())
    }

    /// Publishes `node`'s position on `domain`.
    pub async fn publish(&self, domain: &str, node: &str, position: u64) -> Result<(), CoordError> {
        let value = json!({"domain": domain, "node": node, "position": position});
        self.put(POSITION, &format!("{domain}:{node}"), &value)
            .await
    }

    /// Every node's published position on `domain`: node → position.
    pub async fn positions(&self, domain: &str) -> Result<BTreeMap<String, u64>, CoordError> {
        let all = self.coord.list_records(Bucket::Positions, POSITION).await?;
        Ok(all
            .values()
            .filter(|v| v.get("domain").and_then(Value::as_str) == Some(domain))
            .filter_map(|v| Some((v.get("node")?.as_str()?.to_owned(), u(v, "position"))))
            .collect())
    }

    /// Holds the trim of `domain` at `position` under `name` (a backup, a
    /// joining node) until [`PositionBook::unpin`].
    pub async fn pin(&self, domain: &str, name: &str, position: u64) -> Result<(), CoordError> {
        let value = json!({"domain": domain, "name": name, "position": position,
                           "at_ms": crewlet_os::now_ms()});
        self.put(PIN, &format!("{domain}:{name}"), &value).await
    }

    /// Like [`PositionBook::pin`], but the pin stops counting at
    /// `lapses_at_ms` (wall clock) if nobody unpinned it by then.
    pub async fn pin_until(
        &self,
        domain: &str,
        name: &str,
        position: u64,
        lapses_at_ms: i64,
    ) -> Result<(), CoordError> {
        let value = json!({"domain": domain, "name": name, "position": position,
                           "at_ms": crewlet_os::now_ms(), "lapses_at_ms": lapses_at_ms});
        self.put(PIN, &format!("{domain}:{name}"), &value).await
    }

    /// Lets go of pin `name` on `domain`.
    pub async fn unpin(&self, domain: &str, name: &str) -> Result<(), CoordError> {
        self.coord
            .remove_record(Bucket::Positions, PIN, &format!("{domain}:{name}"))
            .await
            .map(|_| ())
    }

    /// The pins held on `domain` and not lapsed: name → position.
    pub async fn pins(&self, domain: &str) -> Result<BTreeMap<String, u64>, CoordError> {
        let all = self.coord.list_records(Bucket::Positions, PIN).await?;
        let now = crewlet_os::now_ms();
        Ok(all
            .values()
            .filter(|v| v.get("domain").and_then(Value::as_str) == Some(domain))
            .filter(|v| {
                v.get("lapses_at_ms")
                    .and_then(Value::as_i64)
                    .is_none_or(|at| at > now)
            })
            .filter_map(|v| Some((v.get("name")?.as_str()?.to_owned(), u(v, "position"))))
            .collect())
    }

    /// Records an operator's eviction of `node` (its position row stays:
    /// a readmission is judged by it).
    pub async fn evict(&self, eviction: &Eviction) -> Result<(), CoordError> {
        let value = serde_json::to_value(eviction).unwrap_or_default();
        self.put(EVICTED, &eviction.node, &value).await
    }

    /// Every eviction recorded.
    pub async fn evictions(&self) -> Result<Vec<Eviction>, CoordError> {
        let all = self.coord.list_records(Bucket::Positions, EVICTED).await?;
        Ok(all
            .into_values()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect())
    }

    /// The standing eviction of `node`, if an operator evicted it.
    pub async fn eviction_of(&self, node: &str) -> Result<Option<Eviction>, CoordError> {
        match self
            .coord
            .get_record(Bucket::Positions, EVICTED, node)
            .await?
        {
            Answer::Yes((v, _)) => Ok(serde_json::from_value(v).ok()),
            Answer::No(()) => Ok(None),
        }
    }

    /// Ends `node`'s eviction (an operator readmitted it): the trim counts
    /// its position again once it publishes one. Answers the eviction
    /// ended, or `None` when the node was not evicted.
    pub async fn readmit(&self, node: &str) -> Result<Option<Eviction>, CoordError> {
        let Some(eviction) = self.eviction_of(node).await? else {
            return Ok(None);
        };
        // Removed by another operator's readmit meanwhile: the same outcome.
        self.coord
            .remove_record(Bucket::Positions, EVICTED, node)
            .await
            .map(|_| ())?;
        Ok(Some(eviction))
    }

    /// Forgets everything recorded about `domain`'s log — every node's
    /// position, the pins, the floor — because the log was restored from a
    /// backup and numbers its records anew (evictions stay: they are about
    /// nodes, not positions).
    pub async fn forget_log(&self, domain: &str) -> Result<(), CoordError> {
        for class in [POSITION, PIN] {
            let all = self.coord.list_records(Bucket::Positions, class).await?;
            for (id, v) in all {
                if v.get("domain").and_then(Value::as_str) == Some(domain) {
                    self.coord
                        .remove_record(Bucket::Positions, class, &id)
                        .await
                        .map(|_| ())?;
                }
            }
        }
        self.coord
            .remove_record(Bucket::Positions, FLOOR, domain)
            .await
            .map(|_| ())?;
        Ok(())
    }

    /// The floor the trim published for `domain` (0: never trimmed).
    pub async fn floor(&self, domain: &str) -> Result<u64, CoordError> {
        match self
            .coord
            .get_record(Bucket::Positions, FLOOR, domain)
            .await?
        {
            Answer::Yes((v, _)) => Ok(u(&v, "floor")),
            Answer::No(()) => Ok(0),
        }
    }

    /// Publishes the trim's floor for `domain`, before anything is purged.
    pub async fn set_floor(&self, domain: &str, floor: u64, by: &str) -> Result<(), CoordError> {
        let value =
            json!({"domain": domain, "floor": floor, "by": by, "at_ms": crewlet_os::now_ms()});
        self.put(FLOOR, domain, &value).await
    }
}
