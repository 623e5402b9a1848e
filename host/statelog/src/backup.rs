//! The estate in a backup, and back.
//!
//! Rule: a backup pins every domain's log at the estate's position before
//! it copies the estate, so the trim cannot pass what the copy stands on
//! while the streams are read; the pin is let go after, and lapses on its
//! own after [`BACKUP_PIN_LAPSE`] if the backup died first (a crashed
//! backup must not hold the trim for ever; an hour is far past any
//! backup's run). A restore installs the copy with each domain's cursor
//! moved onto the restored log, whose records the broker numbers anew.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::{Estate, EstateError, PositionBook, Positions};

/// How long a backup's pin counts if the backup never lets go of it.
pub const BACKUP_PIN_LAPSE: Duration = Duration::from_secs(3600);

/// Why the estate could not be put in a backup.
#[derive(Debug, thiserror::Error)]
pub enum EstateBackupError {
    #[error(
        "the positions bucket did not answer while pinning the state log: {0}; no backup was written, retry"
    )]
    Pin(#[from] crewlet_coord::CoordError),
    #[error(transparent)]
    Estate(#[from] EstateError),
    #[error("the estate's copy did not finish: {0}; no backup was written, retry")]
    Task(String),
}

/// Pins each of `domains` at the estate's position under `pin`, then
/// writes a consistent copy of the estate to `into`; answers the positions
/// the copy stands at (at or past every pin). Let go with [`unpin`], also
/// when the backup fails after this.
pub async fn pin_and_copy(
    estate: &Arc<Estate>,
    book: &PositionBook,
    domains: &[&str],
    pin: &str,
    into: &Path,
) -> Result<Positions, EstateBackupError> {
    let lapses = crewlet_os::now_ms() + BACKUP_PIN_LAPSE.as_millis() as i64;
    for domain in domains {
        let at = estate.cursor(domain)?.position;
        if let Err(e) = book.pin_until(domain, pin, at, lapses).await {
            unpin(book, domains, pin).await;
            return Err(e.into());
        }
    }
    let (estate, into) = (estate.clone(), into.to_owned());
    let copied = match tokio::task::spawn_blocking(move || estate.snapshot_to(&into)).await {
        Ok(Ok(positions)) => Ok(positions),
        Ok(Err(e)) => Err(e.into()),
        Err(e) => Err(EstateBackupError::Task(e.to_string())),
    };
    if copied.is_err() {
        unpin(book, domains, pin).await;
    }
    copied
}

/// Lets go of a backup's pins (one that cannot be removed lapses).
pub async fn unpin(book: &PositionBook, domains: &[&str], pin: &str) {
    for domain in domains {
        if let Err(e) = book.unpin(domain, pin).await {
            tracing::warn!(subsystem = "statelog", domain, pin, error = %e,
                "a backup's pin was not removed; it lapses on its own");
        }
    }
}

/// Installs a backup's estate copy `from` into `data_dir` (which must hold
/// no estate yet), each domain's cursor moved by `rebase` onto the
/// restored log; answers the positions installed.
pub fn restore(
    from: &Path,
    data_dir: &Path,
    rebase: &dyn Fn(&str, u64) -> u64,
) -> Result<Positions, EstateError> {
    crate::estate::restore_into(from, &data_dir.join(crate::ESTATE_FILE), rebase)
}
