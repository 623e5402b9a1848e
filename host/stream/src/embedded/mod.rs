//! The embedded broker: a nats-server child the node supervises.
//!
//! The child runs JetStream with its store under the node's data dir, on a
//! loopback client port, and — unless the operator opts out — with
//! `sync_interval: always`, because an acknowledged write must survive a
//! crash (the Jepsen analysis of NATS 2.12.1 lost acknowledged writes under
//! the lazy default). The node starts it first, restarts it with backoff if
//! it dies behind the node's back, and stops it last. The child cannot outlive
//! the node: it carries a parent-death signal, so even a SIGKILLed node takes
//! it down. It runs in its own process group so a terminal's Ctrl-C reaches
//! the node alone, which then stops the child in order.
//!
//! One store dir, one server: the store dir is locked for the life of the
//! supervisor, and a second node pointed at it refuses to start.
//!
//! Locked: the server takes clients on 127.0.0.1 only and admits one user,
//! the node's own nkey ([`crate::credential`]); its config file names the
//! public key alone. A client without the seed is refused at connect.
//!
//! Clustered (`[stream.cluster]`): the server also takes routes from its
//! peers' embedded servers where `listen` says, admitting only the shared
//! route secret, and JetStream replicates the fleet's streams across them
//! ([`conf`]); its peers and meta leader are read for `/health`
//! ([`peers`]).

mod conf;
mod peers;

pub use peers::{CLUSTER_POLL, ClusterStatus};

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conf::{ServerConf, reported_ports};
use crewlet_config::{EmbeddedBroker, SyncPolicy};
use crewlet_os::DieWithParent;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, error, info, warn};

use crate::StreamError;
use crate::credential::BrokerCredential;
use crate::locate::locate_nats_server;
use crate::lock::DirLock;

/// How long a stop waits for the child to exit on SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long start-up waits for the child to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Restart backoff: first delay, ceiling, and the uptime that resets it.
const BACKOFF_FIRST: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(60);
/// Lines of the child's log kept for an error report.
const TAIL_LINES: usize = 20;

/// What the node reports about its child.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BrokerStatus {
    pub binary: String,
    pub store_dir: String,
    pub port: u16,
    pub sync: &'static str,
    pub running: bool,
    pub pid: Option<u32>,
    /// Times the child was restarted after dying unexpectedly.
    pub restarts: u32,
    /// The file holding the node's nkey seed: a client needs it to connect.
    pub credential_file: String,
    /// `[stream.cluster]`: the routes up and the JetStream meta group, read
    /// every [`CLUSTER_POLL`]; `None` for a server that runs alone.
    pub cluster: Option<ClusterStatus>,
}

/// The running child and the task that watches it.
pub struct Supervisor {
    port: u16,
    credential: BrokerCredential,
    status: Arc<Mutex<BrokerStatus>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    _lock: DirLock,
}

struct Launch {
    binary: PathBuf,
    conf: PathBuf,
    tail: Arc<Mutex<VecDeque<String>>>,
}

impl Supervisor {
    /// Locks the store dir, writes the server config, starts the child and
    /// waits until it accepts connections.
    pub async fn start(
        spec: &EmbeddedBroker,
        node_id: &str,
        mut cancel: watch::Receiver<bool>,
    ) -> Result<Supervisor, StreamError> {
        let binary = locate_nats_server(spec.nats_server.as_deref())?;
        let credential = BrokerCredential::load_or_create(&spec.credential)?;
        let files = |path: &Path| {
            let path = path.display().to_string();
            move |source| StreamError::Files { path, source }
        };
        std::fs::create_dir_all(&spec.store_dir).map_err(files(&spec.store_dir))?;
        let store_dir = spec
            .store_dir
            .canonicalize()
            .map_err(files(&spec.store_dir))?;
        let lock = DirLock::acquire(
            &store_dir,
            ".crewlet-broker.lock",
            "stream store dir",
            &format!("crewlet node {node_id}"),
        )?;
        // Port 0: the server picks a free port itself and reports it in its
        // ports file. Picking one here and handing it over would leave a
        // window in which any outgoing connection may be given that port.
        let requested = (spec.port != 0).then_some(spec.port);
        let conf = store_dir.join("nats-server.conf");
        let server_conf = |port| ServerConf {
            node_id,
            port,
            store_dir: &store_dir,
            sync: spec.sync,
            user: credential.public_key(),
            cluster: spec.cluster.as_ref(),
        };
        server_conf(requested).write(&conf).map_err(files(&conf))?;

        let launch = Launch {
            binary,
            conf,
            tail: Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_LINES))),
        };
        let mut child = launch.spawn()?;
        let status = Arc::new(Mutex::new(BrokerStatus {
            binary: launch.binary.display().to_string(),
            store_dir: store_dir.display().to_string(),
            port: requested.unwrap_or(0),
            sync: match spec.sync {
                SyncPolicy::Always => "always",
                SyncPolicy::ServerDefault => "server-default",
            },
            running: true,
            pid: child.id(),
            restarts: 0,
            credential_file: credential.path().display().to_string(),
            cluster: spec.cluster.as_ref().map(ClusterStatus::new),
        }));

        let waited = tokio::select! {
            r = wait_accepting(requested, &store_dir, &mut child, &launch.tail) => r,
            _ = cancel.wait_for(|c| *c) => Err(StreamError::Interrupted),
        };
        let port = match waited {
            Ok(port) => port,
            Err(e) => {
                terminate(&mut child).await;
                return Err(e);
            }
        };
        status.lock().expect("status").port = port;
        // A restart comes back on the same port: the client reconnects to it.
        if let Err(e) = server_conf(Some(port)).write(&launch.conf) {
            terminate(&mut child).await;
            return Err(files(&launch.conf)(e));
        }
        info!(
            subsystem = "broker",
            port,
            pid = child.id(),
            store_dir = %store_dir.display(),
            sync = status.lock().expect("status").sync,
            "embedded nats-server is up"
        );

        let (stop, stop_rx) = watch::channel(false);
        if spec.cluster.is_some() {
            tokio::spawn(
                watch_cluster(status.clone(), store_dir.clone(), stop_rx.clone()).in_current_span(),
            );
        }
        let task =
            tokio::spawn(supervise(launch, child, status.clone(), stop_rx).in_current_span());
        Ok(Supervisor {
            port,
            credential,
            status,
            stop,
            task,
            _lock: lock,
        })
    }

    pub fn client_url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The node's login to this server.
    pub fn credential(&self) -> &BrokerCredential {
        &self.credential
    }

    pub fn status(&self) -> BrokerStatus {
        self.status.lock().expect("broker status").clone()
    }

    pub(crate) fn status_handle(&self) -> Arc<Mutex<BrokerStatus>> {
        self.status.clone()
    }

    /// Stops the child (SIGTERM, then SIGKILL after a grace period) and
    /// waits for it; the store dir lock is released afterwards.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.task.await {
            error!(subsystem = "broker", error = %e, "broker supervisor task failed");
        }
    }
}

impl Launch {
    fn spawn(&self) -> Result<Child, StreamError> {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--config")
            .arg(&self.conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        // The forking thread is a runtime worker, which lives as long as the
        // node does.
        cmd.die_with_parent();
        let mut child = cmd.spawn().map_err(|source| StreamError::Spawn {
            binary: self.binary.display().to_string(),
            source,
        })?;
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(forward_log(stderr, self.tail.clone()).in_current_span());
        }
        Ok(child)
    }
}

/// Waits until the child accepts clients; answers its client port.
async fn wait_accepting(
    requested: Option<u16>,
    ports_dir: &Path,
    child: &mut Child,
    tail: &Mutex<VecDeque<String>>,
) -> Result<u16, StreamError> {
    let started = Instant::now();
    let pid = child.id().unwrap_or(0);
    loop {
        if let Some(status) = child.try_wait().map_err(|source| StreamError::Spawn {
            binary: "nats-server".into(),
            source,
        })? {
            // Give the log forwarder a moment to drain the last lines.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let last_lines = tail
                .lock()
                .expect("tail")
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join(" | ");
            return Err(StreamError::EarlyExit {
                status: describe(status),
                last_lines,
            });
        }
        let port = requested.or_else(|| reported_ports(ports_dir, pid).map(|(client, _)| client));
        if let Some(port) = port
            && tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        {
            return Ok(port);
        }
        if started.elapsed() > START_TIMEOUT {
            return Err(StreamError::StartTimeout {
                port: port.unwrap_or(0),
                waited: START_TIMEOUT,
            });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Reads the server's cluster state into `status` every [`CLUSTER_POLL`]
/// until `stop` flips.
async fn watch_cluster(
    status: Arc<Mutex<BrokerStatus>>,
    ports_dir: PathBuf,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let pid = status.lock().expect("broker status").pid;
        let read = peers::read(&ports_dir, pid).await;
        if let Some(c) = status.lock().expect("broker status").cluster.as_mut() {
            c.apply(read);
        }
        tokio::select! {
            _ = tokio::time::sleep(CLUSTER_POLL) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Watches the child until asked to stop; restarts it when it dies.
async fn supervise(
    launch: Launch,
    mut child: Child,
    status: Arc<Mutex<BrokerStatus>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = BACKOFF_FIRST;
    let mut started = Instant::now();
    loop {
        let exit = tokio::select! {
            exit = child.wait() => Some(exit),
            _ = stop.wait_for(|s| *s) => None,
        };
        let Some(exit) = exit else {
            terminate(&mut child).await;
            let mut s = status.lock().expect("status");
            s.running = false;
            s.pid = None;
            info!(subsystem = "broker", "embedded nats-server stopped");
            return;
        };
        let how = exit.map(describe).unwrap_or_else(|e| e.to_string());
        {
            let mut s = status.lock().expect("status");
            s.running = false;
            s.pid = None;
        }
        if started.elapsed() > BACKOFF_RESET_AFTER {
            backoff = BACKOFF_FIRST;
        }
        warn!(subsystem = "broker", exit = %how, retry_in = ?backoff,
            "nats-server exited unexpectedly; restarting it");
        // Respawn until it works or the node stops.
        loop {
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
            match launch.spawn() {
                Ok(c) => {
                    child = c;
                    started = Instant::now();
                    let mut s = status.lock().expect("status");
                    s.running = true;
                    s.pid = child.id();
                    s.restarts += 1;
                    info!(
                        subsystem = "broker",
                        pid = s.pid,
                        restarts = s.restarts,
                        "nats-server restarted"
                    );
                    break;
                }
                Err(e) => error!(subsystem = "broker", error = %e, retry_in = ?backoff,
                    "cannot restart nats-server"),
            }
        }
    }
}

/// SIGTERM, a grace period, then SIGKILL; always reaps.
async fn terminate(child: &mut Child) {
    if let Some(pid) = child.id() {
        // SAFETY: signalling our own child by pid; it has not been reaped yet
        // (we hold its handle), so the pid cannot have been reused.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
        if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_ok() {
            return;
        }
        warn!(subsystem = "broker", grace = ?STOP_GRACE, "nats-server ignored SIGTERM; killing it");
    }
    let _ = child.kill().await;
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => status.to_string(),
    }
}

/// Copies the child's log into ours, at a level read from its tag.
async fn forward_log(stderr: tokio::process::ChildStderr, tail: Arc<Mutex<VecDeque<String>>>) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        {
            let mut t = tail.lock().expect("tail");
            if t.len() == TAIL_LINES {
                t.pop_front();
            }
            t.push_back(line.clone());
        }
        let msg = line
            .split_once("] ")
            .and_then(|(head, rest)| head.contains('[').then_some(rest))
            .unwrap_or(&line);
        if line.contains("[ERR]") || line.contains("[FTL]") {
            error!(
                subsystem = "broker",
                target_process = "nats-server",
                "{msg}"
            );
        } else if line.contains("[WRN]") {
            warn!(
                subsystem = "broker",
                target_process = "nats-server",
                "{msg}"
            );
        } else {
            debug!(
                subsystem = "broker",
                target_process = "nats-server",
                "{msg}"
            );
        }
    }
}
