//! Exclusive ownership of a directory for the life of a process.
//!
//! A data dir and a JetStream store dir each belong to one process: two
//! nats-servers on one store corrupt it, and two nodes on one data dir would
//! each believe the node store is theirs. An advisory `flock` on a file in the
//! directory settles it; the kernel drops the lock when the holder dies, so a
//! crashed node never leaves a stale lock behind.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "{what} {dir} is in use by another process ({holder}); give each node its own data dir (node.data_dir / --data-dir) and store dir"
    )]
    Held {
        what: &'static str,
        dir: String,
        holder: String,
    },
    #[error("cannot lock {what} {dir}: {source}")]
    Io {
        what: &'static str,
        dir: String,
        #[source]
        source: std::io::Error,
    },
}

/// Held while the value lives; the lock file stays behind, unlocked.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    path: PathBuf,
}

impl DirLock {
    /// Locks `dir` (which must exist) via `dir/name`, recording `owner` in it.
    pub fn acquire(
        dir: &Path,
        name: &str,
        what: &'static str,
        owner: &str,
    ) -> Result<DirLock, LockError> {
        let path = dir.join(name);
        let io = |source| LockError::Io {
            what,
            dir: dir.display().to_string(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        // SAFETY: flock on a descriptor we own.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(LockError::Held {
                    what,
                    dir: dir.display().to_string(),
                    holder: if holder.is_empty() {
                        "holder unknown".into()
                    } else {
                        holder.to_owned()
                    },
                });
            }
            return Err(io(err));
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{owner}, pid {}", std::process::id()).map_err(io)?;
        Ok(DirLock { _file: file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_holder_is_refused_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path(), ".lock", "data dir", "node a").unwrap();
        let err = DirLock::acquire(dir.path(), ".lock", "data dir", "node b").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("in use"), "{msg}");
        assert!(msg.contains("node a"), "{msg}");
        drop(first);
        DirLock::acquire(dir.path(), ".lock", "data dir", "node b").unwrap();
    }
}
