//! The node's stable id.
//!
//! A node without `node.id` in its config gets one generated once and kept
//! in its data dir, so a restart is the same node to its peers: the same
//! presence lease, the same name in every log line.

use std::io::Write;
use std::path::Path;

use crewlet_config::validate_node_id;

const FILE: &str = "node-id";

/// Reads `<data_dir>/node-id`, creating it on first start.
pub fn stable_node_id(data_dir: &Path) -> std::io::Result<String> {
    let path = data_dir.join(FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let id = text.trim().to_owned();
            validate_node_id(&id).map_err(|why| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "{} holds an invalid node id ({why}); fix it or delete the file to generate a new one",
                        path.display()
                    ),
                )
            })?;
            Ok(id)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = generate();
            // Write then rename, so a crash never leaves a half-written id.
            let tmp = data_dir.join(format!("{FILE}.tmp"));
            let mut f = std::fs::File::create(&tmp)?;
            writeln!(f, "{id}")?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            Ok(id)
        }
        Err(e) => Err(e),
    }
}

/// `<host>-<12 hex>`: readable in a fleet view, unique without coordination.
fn generate() -> String {
    let host = hostname()
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(40)
        .collect::<String>();
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..12];
    if host.is_empty() {
        format!("node-{suffix}")
    } else {
        format!("{host}-{suffix}")
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_is_generated_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let first = stable_node_id(dir.path()).unwrap();
        validate_node_id(&first).unwrap();
        assert_eq!(stable_node_id(dir.path()).unwrap(), first);
    }

    #[test]
    fn a_corrupt_id_file_is_an_error_not_a_new_identity() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "bad id with spaces\n").unwrap();
        let err = stable_node_id(dir.path()).unwrap_err().to_string();
        assert!(err.contains("invalid node id"), "{err}");
    }
}
