//! The node already running beside the doctor, as its `/health` says:
//! whether a port that would not bind is that node's own (the same data
//! dir: the setup working), another node's (named), or something else's.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crewlet_config::NodeConfig;

use super::{Finding, REACH_WITHIN, Verdict, bad, ok};

/// A crewlet node already answering `/health` on the configured API port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RunningNode {
    node_id: String,
    version: String,
    phase: String,
    data_dir: Option<PathBuf>,
    /// Whether it runs with the data dir these arguments name.
    ours: bool,
}

impl RunningNode {
    pub(super) fn find(config: &NodeConfig) -> Option<RunningNode> {
        if config.api.port == 0 {
            return None;
        }
        let host = match config.api.host {
            h if h.is_unspecified() && h.is_ipv4() => std::net::Ipv4Addr::LOCALHOST.into(),
            h if h.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
            h => h,
        };
        let api = format!("http://{}", SocketAddr::new(host, config.api.port));
        RunningNode::of(
            &crate::client::health(&api, REACH_WITHIN)?,
            &config.data_dir,
        )
    }

    /// What a `/health` body says of its node; `None` when it is not one.
    fn of(health: &serde_json::Value, data_dir: &Path) -> Option<RunningNode> {
        let text = |k: &str| health[k].as_str().map(str::to_owned);
        let theirs = text("data_dir").map(PathBuf::from);
        let same = |a: &Path, b: &Path| {
            let full = |p: &Path| {
                p.canonicalize()
                    .or_else(|_| std::path::absolute(p))
                    .unwrap_or_else(|_| p.to_path_buf())
            };
            full(a) == full(b)
        };
        Some(RunningNode {
            node_id: text("node_id")?,
            version: text("version").unwrap_or_default(),
            phase: text("phase").unwrap_or_default(),
            ours: theirs.as_deref().is_some_and(|d| same(d, data_dir)),
            data_dir: theirs,
        })
    }

    fn describe(&self) -> String {
        format!(
            "node {} (crewlet {}, {}, data dir {})",
            self.node_id,
            self.version,
            self.phase,
            self.data_dir
                .as_deref()
                .map_or("unknown".into(), |d| d.display().to_string())
        )
    }
}

/// A port that would not bind, judged against the node running there.
pub(super) fn taken(
    check: &'static str,
    addr: SocketAddr,
    key: &str,
    e: &std::io::Error,
    running: Option<&RunningNode>,
) -> Finding {
    match running {
        Some(node) if node.ours => ok(
            check,
            format!(
                "{addr} is held by the node already running with this data dir: {}",
                node.describe()
            ),
        ),
        Some(node) => bad(
            check,
            Verdict::Fail,
            format!(
                "{addr} is in use, and another crewlet node answers on the API port: {}",
                node.describe()
            ),
            format!(
                "stop that node, or give this one its own {key} (and its own --data-dir); to check that node, run doctor with its --data-dir"
            ),
        ),
        None => bad(
            check,
            Verdict::Fail,
            format!("{addr}: {e}"),
            format!("stop what listens there (another node?), or set {key}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_node_is_ours_when_its_data_dir_is_the_same_folder() {
        let dir = tempfile::tempdir().unwrap();
        let health = serde_json::json!({
            "node_id": "n1", "version": "0.1.0", "phase": "running",
            "data_dir": dir.path().display().to_string(),
        });
        let same = RunningNode::of(&health, &dir.path().join(".")).unwrap();
        assert!(same.ours, "{same:?}");
        assert!(same.describe().contains("node n1"), "{}", same.describe());
        let other = RunningNode::of(&health, &dir.path().join("elsewhere")).unwrap();
        assert!(!other.ours);
        assert!(RunningNode::of(&serde_json::json!({"status": "ok"}), dir.path()).is_none());
    }
}
