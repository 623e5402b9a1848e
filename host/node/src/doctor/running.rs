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
    /// Its `/health` `secrets` (`crewlet_secrets::Standing`), if it says.
    secrets: Option<serde_json::Value>,
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
            secrets: Some(health["secrets"].clone()).filter(|s| s.is_object()),
        })
    }

    /// What the node running with this data dir says of its secrets: known
    /// and followed (ok), known from its last listing, or unknown (a
    /// warning: `run` is not stopped by it, but work waits).
    pub(super) fn secrets(&self, now_ms: i64) -> Option<Finding> {
        const CHECK: &str = "node secrets";
        let s = self.secrets.as_ref().filter(|_| self.ours)?;
        let for_s = (now_ms - s["since_ms"].as_i64()?).max(0) / 1000;
        let error = s["error"].as_str().unwrap_or("no reason given");
        Some(match (s["state"].as_str()?, s["source"].as_str()?) {
            ("known", "bucket") => ok(
                CHECK,
                format!(
                    "the running node knows the fleet's secrets (its watch has followed the bucket for {for_s} s)"
                ),
            ),
            ("known", _) => bad(
                CHECK,
                Verdict::Warn,
                format!(
                    "the running node answers from the secrets bucket's last listing: the bucket has not been followed for {for_s} s ({error})"
                ),
                "check that the node's NATS user may read the secrets bucket; the node opens it again by itself, and a secret changed meanwhile reaches it then",
            ),
            _ => bad(
                CHECK,
                Verdict::Warn,
                format!(
                    "the running node's secrets are unknown: the bucket has not answered it for {for_s} s ({error}); its webhooks answer 503, seats that need a secret wait, turns are retried"
                ),
                "let the node's NATS user read the secrets bucket (the reason above says what refused it); nothing is lost meanwhile, and the node goes on trying",
            ),
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
        assert!(same.secrets(0).is_none(), "an older node says nothing");
        assert!(RunningNode::of(&serde_json::json!({"status": "ok"}), dir.path()).is_none());
    }

    #[test]
    fn the_running_nodes_secrets_are_ok_when_followed_and_a_warning_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let node = |state: &str, source: &str| {
            let health = serde_json::json!({
                "node_id": "n1", "data_dir": dir.path().display().to_string(),
                "secrets": {"state": state, "since_ms": 1_000, "source": source, "error": "refused"},
            });
            RunningNode::of(&health, dir.path()).unwrap()
        };
        let known = node("known", "bucket").secrets(41_000).unwrap();
        assert_eq!(known.verdict, Verdict::Ok);
        assert!(known.detail.contains("40 s"), "{}", known.detail);
        let stale = node("known", "last_listing").secrets(41_000).unwrap();
        assert_eq!(stale.verdict, Verdict::Warn);
        assert!(stale.detail.contains("last listing"), "{}", stale.detail);
        let unknown = node("unknown", "none").secrets(41_000).unwrap();
        assert_eq!(unknown.verdict, Verdict::Warn);
        assert!(
            unknown.detail.contains("unknown") && unknown.detail.contains("refused"),
            "{}",
            unknown.detail
        );
        let elsewhere = serde_json::json!({"node_id": "n2", "data_dir": "/elsewhere",
            "secrets": {"state": "unknown", "since_ms": 0, "source": "none"}});
        let theirs = RunningNode::of(&elsewhere, dir.path()).unwrap();
        assert!(theirs.secrets(0).is_none(), "another data dir's node");
    }
}
