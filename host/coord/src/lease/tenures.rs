//! Who held a resource before: the epochs bucket read as a hint.
//!
//! Rule: every epoch record names its owner and the owner of the epoch
//! before it, written in the same compare-and-swap that mints the epoch, so
//! one listing of the bucket says who held each resource last and before
//! that. Why: placement prefers a seat's previous holder (warm MCP
//! children), and the epochs bucket is the one record that outlives a
//! release. It orders, never gates: the lease's own read decides who holds
//! what, and a record a build wrote without `previous` reads as unknown.

use std::collections::HashMap;

use super::{EpochRecord, Owner};
use crate::answer::CoordError;
use crate::bucket::Bucket;
use crate::names::{ResourceName, check_class};
use crate::{Coord, decode};

/// Who held a resource's last two epochs, from the epochs bucket: a hint
/// for placement (a node prefers what it held before), never a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenures {
    /// The latest epoch.
    pub epoch: crate::FenceEpoch,
    /// Its owner: the holder now, or the last one if the lease is free.
    pub last: Owner,
    /// The owner of the epoch before it, when known.
    pub before: Option<Owner>,
}

impl Coord {
    /// Who held each resource of one class last, and before that (the
    /// epochs bucket, a certified listing; an error, never a short map),
    /// keyed by id. A hint: a lease's own read decides who holds it.
    pub async fn tenures(&self, class: &str) -> Result<HashMap<String, Tenures>, CoordError> {
        check_class(class)?;
        let epochs = self
            .kv(Bucket::Epochs)
            .list(Bucket::Epochs, Some(class))
            .await?;
        let mut out = HashMap::new();
        for e in &epochs {
            let r: EpochRecord = decode(Bucket::Epochs, e)?;
            if let Some(name) = ResourceName::from_key(&e.key) {
                out.insert(
                    name.id().to_owned(),
                    Tenures {
                        epoch: r.epoch,
                        last: r.owner,
                        before: r.previous,
                    },
                );
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Answer, FenceEpoch};

    #[tokio::test]
    async fn the_epochs_say_who_held_the_last_two_tenures() {
        let opts = crate::CoordOptions::new(Owner::incarnation("x"));
        let kv = crate::MemoryKv::new(
            std::sync::Arc::new(crate::SystemClock),
            &crate::bucket::Retentions {
                lease_ttl: opts.lease_ttl,
                status: opts.status_age,
                rate: opts.rate_age,
            },
        );
        let c = Coord::memory(kv, opts);
        let name = ResourceName::seat("ada").unwrap();
        let (a, b) = (Owner::incarnation("node-a"), Owner::incarnation("node-b"));
        assert!(c.tenures("seat").await.unwrap().is_empty());
        let Ok(Answer::Yes(la)) = c.acquire(&name, &a, None).await else {
            panic!("free seat not acquired")
        };
        let t = &c.tenures("seat").await.unwrap()["ada"];
        assert_eq!((t.epoch, &t.last, &t.before), (FenceEpoch(1), &a, &None));
        assert_eq!(t.last.node(), "node-a");
        assert!(matches!(c.release(&la).await, Ok(Answer::Yes(()))));
        let Ok(Answer::Yes(_)) = c.acquire(&name, &b, None).await else {
            panic!("released seat not acquired")
        };
        let t = &c.tenures("seat").await.unwrap()["ada"];
        assert_eq!(
            (t.epoch, &t.last, &t.before),
            (FenceEpoch(2), &b, &Some(a.clone()))
        );
        // A record of a build that wrote no `previous` reads as unknown.
        let old: EpochRecord = serde_json::from_str(r#"{"epoch":4,"owner":"n/1"}"#).unwrap();
        assert_eq!(old.previous, None);
    }
}
