//! Refused requests kept for replay (`[ingress] record_refused = N`, off
//! by default): each refusal of the webhook edge written to
//! `<data_dir>/refused/` as a [`Capture`] (credential headers dropped, the
//! route's secret scrubbed — see `crewlet_plugins::trial`), the newest `N`
//! kept, so `crewlet plugins try NAME --request FILE` can replay what a
//! failing sender sent. Written off the request's path; a write that fails
//! is logged at debug and costs the sender nothing.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use crewlet_plugins::trial::Capture;
use http::HeaderMap;
use tracing::debug;

use super::Edge;
use super::route::Route;

/// Where refused requests go, and how many are kept.
#[derive(Debug)]
pub struct RefusedLog {
    dir: PathBuf,
    keep: usize,
    seq: AtomicU64,
}

impl RefusedLog {
    /// A log in `dir` (made, mode 0700) keeping the newest `keep`
    /// (bounded by the node's configuration, `ingress.record_refused`).
    pub fn new(dir: PathBuf, keep: usize) -> std::io::Result<RefusedLog> {
        std::fs::create_dir_all(&dir)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(RefusedLog {
            dir,
            keep,
            seq: AtomicU64::new(0),
        })
    }

    /// Writes `capture` for `source` on a blocking thread, then drops the
    /// oldest files past the bound; the handle is for a caller that waits.
    pub fn record(&self, source: &str, capture: Capture) -> tokio::task::JoinHandle<()> {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let file = self
            .dir
            .join(format!("{}-{n:06}-{source}.json", crewlet_os::now_ms()));
        let (dir, keep) = (self.dir.clone(), self.keep);
        tokio::task::spawn_blocking(move || {
            if let Err(e) = write(&file, &capture).and_then(|()| prune(&dir, keep)) {
                debug!(subsystem = "ingress", file = %file.display(), error = %e, "refused request not recorded");
            }
        })
    }
}

impl Edge {
    /// Records a refused request for replay, with the route's secret
    /// scrubbed from it (see [`RefusedLog`]).
    pub(super) fn keep_refused(
        &self,
        log: &RefusedLog,
        route: &Route,
        headers: &HeaderMap,
        body: &[u8],
        reason: &str,
    ) {
        let secret = route.found_secret();
        let mut capture = crewlet_plugins::trial::Capture::of(
            &route.path(),
            headers.iter().map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            }),
            body,
            crewlet_os::now_ms() as i64 / 1000,
            &secret.map(|s| vec![s.as_bytes()]).unwrap_or_default(),
        );
        capture.refused = Some(reason.to_string());
        log.record(route.source(), capture);
    }
}

/// Writes `capture` whole under a hidden name, then renames it into place:
/// a reader of the directory (an operator, `plugins try`) never sees a
/// record half written. A failed write leaves nothing behind.
fn write(file: &std::path::Path, capture: &Capture) -> std::io::Result<()> {
    use std::io::Write;
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("capture");
    let partial = file.with_file_name(format!(".{name}.partial"));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let written = opts.open(&partial).and_then(|mut f| {
        f.write_all(&serde_json::to_vec_pretty(capture).expect("a capture serialises"))
    });
    match written.and_then(|()| std::fs::rename(&partial, file)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

/// Keeps the `keep` newest files (their names sort by time).
fn prune(dir: &std::path::Path, keep: usize) -> std::io::Result<()> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    if names.len() <= keep {
        return Ok(());
    }
    names.sort();
    for old in &names[..names.len() - keep] {
        // A concurrent prune may have taken it already.
        match std::fs::remove_file(old) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_newest_are_kept_private() {
        let tmp = tempfile::tempdir().unwrap();
        let log = RefusedLog::new(tmp.path().join("refused"), 2).unwrap();
        for i in 0..4 {
            let c = Capture::of("/webhooks/slack", [], format!("{i}").as_bytes(), 1, &[]);
            log.record("slack", c).await.unwrap();
        }
        let mut left: Vec<_> = std::fs::read_dir(tmp.path().join("refused"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        left.sort();
        assert_eq!(left.len(), 2, "{left:?}");
        let last: Capture = serde_json::from_slice(&std::fs::read(&left[1]).unwrap()).unwrap();
        assert_eq!(last.body().unwrap(), b"3");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&left[1]).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
    }
}
