//! What a clustered embedded server says about its peers, for `/health`.
//!
//! Rule: `/health` answers from memory and never waits on the broker, so
//! the cluster's state is read by a task of its own every
//! [`CLUSTER_POLL`] from the server's loopback monitoring endpoint
//! (`/routez` for the routes up, `/jsz` for the JetStream meta group) and
//! kept beside the rest of the broker's status. A read that fails says
//! so in `error` and keeps the last peers seen, since a restarting server
//! is not a cluster that lost them.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::conf::reported_ports;

/// How often the cluster's state is read.
pub const CLUSTER_POLL: Duration = Duration::from_secs(2);
/// The most one read of the monitoring endpoint may take.
const READ_WITHIN: Duration = Duration::from_secs(1);

/// The embedded server's cluster, as `/health` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClusterStatus {
    pub name: String,
    /// Where this server takes routes.
    pub listen: String,
    /// Routes configured (`stream.cluster.routes`).
    pub routes_configured: usize,
    /// Peers (server names) this server has a route to now.
    pub peers_connected: Vec<String>,
    /// The JetStream meta leader's server name; `None` while there is none
    /// (no stream or bucket can be created or changed then).
    pub meta_leader: Option<String>,
    /// Servers the JetStream meta group counts, this one included.
    pub meta_cluster_size: Option<usize>,
    /// Why the last read failed, if it did.
    pub error: Option<String>,
}

impl ClusterStatus {
    pub(crate) fn new(c: &crewlet_config::ClusterConfig) -> ClusterStatus {
        ClusterStatus {
            name: c.name.clone(),
            listen: c.listen.to_string(),
            routes_configured: c.routes.len(),
            peers_connected: Vec::new(),
            meta_leader: None,
            meta_cluster_size: None,
            error: None,
        }
    }
}

impl ClusterStatus {
    /// Takes in one read: peers and leader when it answered, the error
    /// (and no leader) when it did not.
    pub(crate) fn apply(&mut self, read: Result<Read, String>) {
        match read {
            Ok((peers, leader, size)) => {
                self.peers_connected = peers;
                self.meta_leader = leader;
                self.meta_cluster_size = size;
                self.error = None;
            }
            Err(e) => {
                self.meta_leader = None;
                self.error = Some(e);
            }
        }
    }
}

/// Reads the state of the server with `pid` (its monitoring port from the
/// ports file in `ports_dir`).
pub(crate) async fn read(ports_dir: &Path, pid: Option<u32>) -> Result<Read, String> {
    match pid.and_then(|pid| reported_ports(ports_dir, pid)) {
        Some((_, Some(monitor))) => read_once(monitor).await,
        _ => Err("the server is not running or has not reported its ports yet".to_owned()),
    }
}

pub(crate) type Read = (Vec<String>, Option<String>, Option<usize>);

async fn read_once(port: u16) -> Result<Read, String> {
    let routez = get_json(port, "/routez").await?;
    let mut peers: Vec<String> = routez["routes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["remote_name"].as_str().map(str::to_owned))
        .collect();
    peers.sort();
    peers.dedup();
    let jsz = get_json(port, "/jsz").await?;
    let meta = &jsz["meta_cluster"];
    let leader = meta["leader"]
        .as_str()
        .filter(|l| !l.is_empty())
        .map(str::to_owned);
    let size = meta["cluster_size"].as_u64().map(|n| n as usize);
    Ok((peers, leader, size))
}

/// One `GET` on the loopback monitoring port (HTTP/1.0: the server closes
/// the connection after its answer, which ends the read).
async fn get_json(port: u16, path: &str) -> Result<serde_json::Value, String> {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("monitoring port {port}: {e}"))?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await
            .map_err(|e| format!("monitoring port {port}: {e}"))?;
        let mut body = Vec::new();
        s.read_to_end(&mut body)
            .await
            .map_err(|e| format!("monitoring port {port}: {e}"))?;
        let text = String::from_utf8_lossy(&body);
        let (_, json) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("{path}: an answer without a body"))?;
        serde_json::from_str(json).map_err(|e| format!("{path}: {e}"))
    };
    tokio::time::timeout(READ_WITHIN, fetch)
        .await
        .map_err(|_| format!("{path} did not answer within {READ_WITHIN:?}"))?
}
