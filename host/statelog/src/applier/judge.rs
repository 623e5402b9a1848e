//! Judging the log against this node's estate and standing: a stream
//! recreated or restored underneath, another record at the checkpoint, an
//! operator's eviction. Each answer ends the pass it is found in.

use async_nats::jetstream;

use super::{ApplierParts, PassEnd};
use crate::estate::Cursor;
use crate::local::Diverged;

pub(super) fn fix_for(d: &Diverged) -> String {
    format!(
        "the log {} no longer matches this node's estate, so nothing more is applied to domain `{}`. \
         If the broker was restored by mistake, restore the copy these rows came from and restart this node. \
         To take the log as it now stands instead: stop this node, delete replicated.sqlite3 and \
         statelog-local.sqlite3 from its data dir, and start it — it rebuilds from the log or a peer's snapshot",
        d.stream, d.domain
    )
}

pub(super) fn identity(info: &jetstream::stream::Info) -> String {
    info.created.unix_timestamp_nanos().to_string()
}

/// Judges the stream against this node's cursor: answers a divergence, if
/// any, and records the identity seen.
pub(super) fn judge(
    parts: &ApplierParts,
    info: &jetstream::stream::Info,
    cursor: Cursor,
) -> Result<(), PassEnd> {
    let stream = parts.domain.stream();
    let now = identity(info);
    let finding = |found: String| {
        PassEnd::Diverged(Diverged {
            domain: parts.domain.name().to_owned(),
            stream: stream.to_owned(),
            position: cursor.position,
            found,
            found_ms: crewlet_os::now_ms(),
        })
    };
    match parts.local.identity(stream)? {
        Some(seen) if seen != now && cursor.position > 0 => {
            return Err(finding(format!(
                "stream {stream} was recreated underneath this node (created {seen} then, {now} now)"
            )));
        }
        Some(seen) if seen == now => {}
        _ => parts.local.see_identity(stream, &now)?,
    }
    if info.state.last_sequence < cursor.position {
        return Err(finding(format!(
            "stream {stream} ends at {}, below this node's position {} (restored from an older copy?)",
            info.state.last_sequence, cursor.position
        )));
    }
    Ok(())
}

/// An operator's eviction of this node ends the pass: a node evicted must
/// neither apply nor publish a position until it is readmitted.
pub(super) async fn judge_standing(parts: &ApplierParts) -> Result<(), PassEnd> {
    let Some(book) = &parts.book else {
        return Ok(());
    };
    match book.eviction_of(&parts.node).await {
        Ok(None) => Ok(()),
        Ok(Some(e)) => Err(PassEnd::Evicted(e)),
        Err(e) => Err(PassEnd::Unavailable(format!(
            "whether this node is evicted is unknown: {e}"
        ))),
    }
}

/// Reads the record at the cursor: another record there is a divergence.
pub(super) async fn judge_checkpoint(
    parts: &ApplierParts,
    stream: &jetstream::stream::Stream,
    cursor: Cursor,
) -> Result<(), PassEnd> {
    if cursor.position == 0 || cursor.record_ns == 0 {
        return Ok(());
    }
    // A record compacted or trimmed away cannot be compared; one there
    // must be the one applied.
    if let Ok(m) = stream.get_raw_message(cursor.position).await {
        let ns = m.time.unix_timestamp_nanos() as i64;
        if ns != cursor.record_ns {
            return Err(PassEnd::Diverged(Diverged {
                domain: parts.domain.name().to_owned(),
                stream: parts.domain.stream().to_owned(),
                position: cursor.position,
                found: format!(
                    "another record sits at position {} (broker instant {ns} ns, this node applied one of {} ns)",
                    cursor.position, cursor.record_ns
                ),
                found_ms: crewlet_os::now_ms(),
            }));
        }
    }
    Ok(())
}
