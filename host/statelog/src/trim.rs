//! The trim: one node for the fleet (a duty) deletes from a domain's log
//! what every counted node has applied.
//!
//! Rule: the floor is the lowest of every published position not evicted
//! by an operator and every pin held; nothing is deleted by a clock, and
//! a node that is merely down still holds the floor (it replays when it
//! returns). The floor is published before anything is purged, so a node
//! below it knows to adopt a snapshot rather than replay a gap. An unknown
//! answer from the positions bucket trims nothing.

use async_nats::jetstream;
use serde::Serialize;

use crate::{Domain, PositionBook};

/// What one trim pass did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Trimmed {
    pub domain: String,
    /// The floor published (records at or below it are gone).
    pub floor: u64,
    /// The nodes and pins it was the lowest of.
    pub counted: usize,
    pub purged: u64,
}

/// Why a trim pass did nothing.
#[derive(Debug, thiserror::Error)]
pub enum TrimError {
    #[error("the positions bucket did not answer: {0}; nothing trimmed")]
    Positions(#[from] crewlet_coord::CoordError),
    #[error("the broker refused the purge of {stream}: {reason}")]
    Broker { stream: String, reason: String },
}

/// One trim pass over `domain`; `by` names the node running it.
pub async fn trim(
    js: &jetstream::Context,
    book: &PositionBook,
    domain: &dyn Domain,
    by: &str,
) -> Result<Option<Trimmed>, TrimError> {
    let name = domain.name();
    let evicted: Vec<String> = book
        .evictions()
        .await?
        .into_iter()
        .map(|e| e.node)
        .collect();
    let positions = book.positions(name).await?;
    let pins = book.pins(name).await?;
    let counted: Vec<u64> = positions
        .iter()
        .filter(|(node, _)| !evicted.contains(node))
        .map(|(_, p)| *p)
        .chain(pins.values().copied())
        .collect();
    let Some(floor) = counted.iter().copied().min() else {
        return Ok(None);
    };
    let before = book.floor(name).await?;
    if floor <= before {
        return Ok(None);
    }
    book.set_floor(name, floor, by).await?;
    let broker = |reason: String| TrimError::Broker {
        stream: domain.stream().to_owned(),
        reason,
    };
    let stream = js
        .get_stream(domain.stream())
        .await
        .map_err(|e| broker(e.to_string()))?;
    let purged = stream
        .purge()
        .sequence(floor + 1)
        .await
        .map_err(|e| broker(e.to_string()))?
        .purged;
    Ok(Some(Trimmed {
        domain: name.to_owned(),
        floor,
        counted: counted.len(),
        purged,
    }))
}
