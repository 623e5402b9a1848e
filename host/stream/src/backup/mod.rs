//! Backups an operator can trust: one artefact (a directory) holding the
//! streams that are the company's state — its coordination buckets (each a
//! `KV_*` stream), module buckets, memory and dead letters — with a
//! manifest naming every file, its SHA-256 and the format it was written in.
//!
//! Rules, and why:
//! - **Verified whole before anything is written.** A restore reads the
//!   manifest, refuses a format newer than this build's ([`FORMAT_VERSION`])
//!   and any file whose checksum differs or that is missing, and only then
//!   publishes a message: a bad artefact loses nothing on the target.
//! - **Each stream read up to its last sequence at the start of the read**:
//!   a write landing during the backup is not half in it.
//! - **Messages travel as stored** (subject, headers, bytes): a bucket's
//!   delete markers and a sealed secret's envelope are restored as they
//!   were, never opened or re-encoded.
//! - **The replicated estate has its slot** ([`Manifest::estate`]): its
//!   copy and the positions it stands at, from a data node; a node without
//!   the estate says so in [`Manifest::no_estate`]. Each dumped message
//!   keeps its position ([`restored_position`]), so the estate's positions
//!   can be moved onto the restored log.

mod dump;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use async_nats::jetstream;
use crewlet_bus::{DLQ_STREAM, MEMORY_STREAM, USAGE_LOG_STREAM};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use dump::{dump_stream, load_stream, restored_position};

/// The artefact format this build writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;
/// The manifest's file name inside the artefact.
pub const MANIFEST: &str = "manifest.json";

/// The coordination buckets that are the company's state (short names),
/// backed up; leases, duties, status, claims, rate and cooldowns are not —
/// they describe who runs what now, which a restored fleet decides again.
pub const COMPANY_BUCKETS: [&str; 10] = [
    "config",
    "secrets",
    "budgets",
    "mailboxes",
    "fires",
    "tokens",
    "positions",
    "ledger",
    "follows",
    "epochs",
];

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error(
        "{0} is not a backup artefact (no readable {MANIFEST}: {1}); point restore at the directory `crewlet backup` wrote"
    )]
    NotAnArtefact(PathBuf, String),
    #[error(
        "the artefact was written in format {found}, newer than this build reads ({supported}); restore it with a crewlet at least as new as the one that wrote it"
    )]
    NewerFormat { found: u32, supported: u32 },
    #[error(
        "the artefact's file {file} does not match its checksum (altered or truncated since the backup); nothing was restored — use an intact copy"
    )]
    Tampered { file: String },
    #[error(
        "the artefact names {file}, which is missing; nothing was restored — use an intact copy"
    )]
    Missing { file: String },
    #[error("cannot write the artefact in {dir}: {detail}; choose a directory the node can write")]
    Write { dir: PathBuf, detail: String },
    #[error("cannot read stream {stream} for the backup: {detail}; check the broker and retry")]
    Read { stream: String, detail: String },
    #[error(
        "cannot restore stream {stream}: {detail}; start the fresh fleet first (it makes every stream and bucket), then restore"
    )]
    Restore { stream: String, detail: String },
}

/// One file of the artefact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub file: String,
    pub sha256: String,
    pub bytes: u64,
    /// The stream the file's messages go back to (none: a file the node
    /// restores itself, such as its own store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    #[serde(default)]
    pub messages: u64,
}

/// The replicated estate's snapshot and the positions it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EstateSlot {
    pub file: String,
    pub positions: BTreeMap<String, u64>,
}

/// What an artefact holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub written_at_ms: i64,
    pub node: String,
    pub files: Vec<FileEntry>,
    #[serde(default)]
    pub estate: Option<EstateSlot>,
    /// Why the artefact holds no estate (the node that wrote it has no
    /// `data` role, or its estate was not open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_estate: Option<String>,
}

/// The hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An artefact being written into `dir`.
pub struct Writer {
    dir: PathBuf,
    manifest: Manifest,
}

impl Writer {
    /// Starts an artefact in `dir` (made if absent; refused if it holds a
    /// manifest already, so a backup never overwrites another).
    pub fn create(dir: &Path, node: &str) -> Result<Writer, BackupError> {
        let fail = |detail: String| BackupError::Write {
            dir: dir.to_owned(),
            detail,
        };
        if dir.join(MANIFEST).exists() {
            return Err(fail("it holds an artefact already".into()));
        }
        std::fs::create_dir_all(dir.join("streams")).map_err(|e| fail(e.to_string()))?;
        Ok(Writer {
            dir: dir.to_owned(),
            manifest: Manifest {
                format: FORMAT_VERSION,
                written_at_ms: crewlet_os::now_ms(),
                node: node.to_owned(),
                files: Vec::new(),
                estate: None,
                no_estate: None,
            },
        })
    }

    /// Adds `bytes` as `file` (relative), for `stream` when it is a dump.
    pub fn add(
        &mut self,
        file: &str,
        bytes: &[u8],
        stream: Option<(&str, u64)>,
    ) -> Result<(), BackupError> {
        std::fs::write(self.dir.join(file), bytes).map_err(|e| BackupError::Write {
            dir: self.dir.clone(),
            detail: format!("{file}: {e}"),
        })?;
        self.manifest.files.push(FileEntry {
            file: file.to_owned(),
            sha256: sha256_hex(bytes),
            bytes: bytes.len() as u64,
            stream: stream.map(|(s, _)| s.to_owned()),
            messages: stream.map_or(0, |(_, n)| n),
        });
        Ok(())
    }

    /// The artefact's directory, for a file written into it in place.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Adds `file`, already written into the artefact's directory.
    pub fn add_written(&mut self, file: &str) -> Result<(), BackupError> {
        let bytes = std::fs::read(self.dir.join(file)).map_err(|e| BackupError::Write {
            dir: self.dir.clone(),
            detail: format!("{file}: {e}"),
        })?;
        self.manifest.files.push(FileEntry {
            file: file.to_owned(),
            sha256: sha256_hex(&bytes),
            bytes: bytes.len() as u64,
            stream: None,
            messages: 0,
        });
        Ok(())
    }

    /// Adds the estate's copy, written into the artefact's directory as
    /// `file`, with the positions it stands at.
    pub fn add_estate(
        &mut self,
        file: &str,
        positions: BTreeMap<String, u64>,
    ) -> Result<(), BackupError> {
        self.add_written(file)?;
        self.manifest.estate = Some(EstateSlot {
            file: file.to_owned(),
            positions,
        });
        Ok(())
    }

    /// Says why the artefact holds no estate.
    pub fn no_estate(&mut self, why: &str) {
        self.manifest.no_estate = Some(why.to_owned());
    }

    /// Writes the manifest last: an artefact without one is not an artefact.
    pub fn finish(self) -> Result<Manifest, BackupError> {
        let text = serde_json::to_vec_pretty(&self.manifest).expect("a manifest serialises");
        std::fs::write(self.dir.join(MANIFEST), text).map_err(|e| BackupError::Write {
            dir: self.dir.clone(),
            detail: e.to_string(),
        })?;
        Ok(self.manifest)
    }
}

/// Reads and verifies the artefact in `dir`: its format, then every file's
/// checksum. Answers the manifest only when all of it holds.
pub fn verify(dir: &Path) -> Result<Manifest, BackupError> {
    let not = |e: String| BackupError::NotAnArtefact(dir.to_owned(), e);
    let text = std::fs::read(dir.join(MANIFEST)).map_err(|e| not(e.to_string()))?;
    // The format first, from a shape every version keeps, so a newer
    // artefact is named as newer rather than as unreadable.
    let format = serde_json::from_slice::<serde_json::Value>(&text)
        .map_err(|e| not(e.to_string()))?["format"]
        .as_u64()
        .ok_or_else(|| not("the manifest names no format".into()))? as u32;
    if format > FORMAT_VERSION {
        return Err(BackupError::NewerFormat {
            found: format,
            supported: FORMAT_VERSION,
        });
    }
    let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| not(e.to_string()))?;
    let estate = manifest.estate.iter().map(|e| e.file.as_str());
    for file in manifest.files.iter().map(|f| f.file.as_str()).chain(estate) {
        if file.contains("..") || Path::new(file).is_absolute() {
            return Err(BackupError::Tampered {
                file: file.to_owned(),
            });
        }
    }
    for f in &manifest.files {
        let bytes = std::fs::read(dir.join(&f.file)).map_err(|_| BackupError::Missing {
            file: f.file.clone(),
        })?;
        if sha256_hex(&bytes) != f.sha256 {
            return Err(BackupError::Tampered {
                file: f.file.clone(),
            });
        }
    }
    Ok(manifest)
}

/// The streams a backup holds on a broker whose coordination buckets are
/// named `{namespace}_*`: the company's buckets, every module bucket
/// (`mod_*`), memory, the dead letters and the usage log — those that exist.
pub async fn streams_to_back_up(
    js: &jetstream::Context,
    namespace: &str,
) -> Result<Vec<String>, BackupError> {
    let mut wanted: Vec<String> = COMPANY_BUCKETS
        .iter()
        .map(|b| format!("KV_{namespace}_{b}"))
        .chain([MEMORY_STREAM, DLQ_STREAM, USAGE_LOG_STREAM].map(str::to_owned))
        .collect();
    let mut names = js.stream_names();
    let mut present = Vec::new();
    while let Some(name) = names.next().await {
        present.push(name.map_err(|e| BackupError::Read {
            stream: "(listing)".into(),
            detail: e.to_string(),
        })?);
    }
    wanted.retain(|w| present.contains(w));
    wanted.extend(present.into_iter().filter(|p| p.starts_with("KV_mod_")));
    wanted.sort();
    Ok(wanted)
}

/// Dumps every stream [`streams_to_back_up`] names into `writer`.
pub async fn write_streams(
    js: &jetstream::Context,
    writer: &mut Writer,
    namespace: &str,
) -> Result<(), BackupError> {
    for stream in streams_to_back_up(js, namespace).await? {
        let (dump, n) = dump_stream(js, &stream).await?;
        writer.add(
            &format!("streams/{stream}.jsonl"),
            &dump,
            Some((&stream, n)),
        )?;
    }
    Ok(())
}

/// What a restore put back: messages per stream.
pub type Restored = BTreeMap<String, u64>;

/// Verifies the artefact in `dir` whole, then publishes every stream dump
/// back onto its stream (each must exist: a started fleet makes them).
pub async fn restore_streams(js: &jetstream::Context, dir: &Path) -> Result<Restored, BackupError> {
    let manifest = verify(dir)?;
    let mut restored = Restored::new();
    for f in &manifest.files {
        let Some(stream) = &f.stream else { continue };
        let bytes = std::fs::read(dir.join(&f.file)).map_err(|_| BackupError::Missing {
            file: f.file.clone(),
        })?;
        restored.insert(stream.clone(), load_stream(js, stream, &bytes).await?);
    }
    Ok(restored)
}
