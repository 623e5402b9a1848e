//! A single nats-server with JetStream, on loopback.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crewlet_os::DieWithParent;

/// The repository root, from this crate's manifest dir (`host/testkit`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("testkit lives at host/testkit")
        .to_path_buf()
}

/// The nats-server the tests run: `CREWLET_NATS_SERVER`, then the project's
/// tools dir, then `PATH`. Panics with the fix when there is none.
pub fn nats_server_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("CREWLET_NATS_SERVER") {
        return PathBuf::from(p);
    }
    let tools = repo_root().join(".tools/bin/nats-server");
    if tools.is_file() {
        return tools;
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("nats-server");
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "no nats-server for the tests: run `./dev test` (or `scripts/bootstrap.sh`), which installs \
         the pinned one into .tools/bin, or set CREWLET_NATS_SERVER"
    );
}

/// A port that was free a moment ago on 127.0.0.1, for a server a test
/// starts with an explicit port.
///
/// The port is taken *below* the kernel's ephemeral range: a port from
/// `bind(0)` comes from that range, and between releasing it and the server
/// binding it, any outgoing connection on the machine (a cluster's route,
/// a client) may be given the same port — a server that then fails to start.
/// Below the range only an explicit bind can collide, and this process hands
/// each port out once.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| {
            r.split_whitespace()
                .next()
                .and_then(|v| v.parse::<u32>().ok())
        })
        .unwrap_or(32768);
    const LOW: u32 = 10_000;
    if ephemeral_low <= LOW + 1_000 {
        return TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("bind a port on loopback");
    }
    let span = ephemeral_low - LOW;
    // Test binaries run one after another; start each at its own offset so
    // a port a previous binary's server still holds is skipped quickly.
    let offset = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (offset + n) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 between {LOW} and {ephemeral_low}");
}

/// Spawns `cmd` so that it dies with the test process, whatever kills it.
///
/// The parent-death signal fires when the *thread* that forked the child
/// exits, not the process; a child forked from a test thread or a blocking
/// pool thread would be killed when that thread ends. So every tied child is
/// forked from one spawner thread that lives as long as the process.
pub fn spawn_tied(mut cmd: Command) -> std::io::Result<Child> {
    type Job = (Command, std::sync::mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: std::sync::OnceLock<std::sync::Mutex<std::sync::mpsc::Sender<Job>>> =
        std::sync::OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("testkit-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("start the spawner thread");
        std::sync::Mutex::new(tx)
    });
    cmd.die_with_parent();
    let (reply, answer) = std::sync::mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((cmd, reply))
        .expect("spawner thread alive");
    answer.recv().expect("spawner thread answers")
}

/// What a server is started with; kept so it can be restarted identically.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    pub name: String,
    pub port: u16,
    pub monitor_port: u16,
    pub store_dir: PathBuf,
    /// Extra command-line arguments (cluster options and the like).
    pub extra_args: Vec<String>,
}

/// One running nats-server. Killed on drop.
pub struct NatsServer {
    spec: ServerSpec,
    child: Option<Child>,
    _store: Option<tempfile::TempDir>,
}

impl NatsServer {
    /// A fresh single server with JetStream, ready when this returns. Ports
    /// handed out by [`free_port`] are unique within one test process only:
    /// another test binary running beside it may bind one first, so a server
    /// that never answers as itself is replaced on fresh ports (three tries).
    pub fn start() -> NatsServer {
        let mut last = String::new();
        for _ in 0..3 {
            let store = tempfile::tempdir().expect("temp store dir");
            let spec = ServerSpec {
                name: format!("test-{}", free_port()),
                port: free_port(),
                monitor_port: free_port(),
                store_dir: store.path().to_path_buf(),
                extra_args: Vec::new(),
            };
            let mut server = NatsServer::spawn(spec);
            server._store = Some(store);
            match server.healthy_within(Duration::from_secs(20)) {
                Ok(()) => return server,
                Err(why) => last = why,
            }
        }
        panic!("{last}");
    }

    /// Starts a server from `spec` without waiting for it.
    pub fn spawn(spec: ServerSpec) -> NatsServer {
        let child = spawn_child(&spec);
        NatsServer {
            spec,
            child: Some(child),
            _store: None,
        }
    }

    pub fn spec(&self) -> &ServerSpec {
        &self.spec
    }

    pub fn port(&self) -> u16 {
        self.spec.port
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.spec.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILLs the server (a crash) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the same server again: same name, ports and store.
    pub fn restart(&mut self) {
        self.kill();
        self.child = Some(spawn_child(&self.spec));
    }

    /// Waits until `/healthz` answers 200 (JetStream current) from this
    /// server — `/varz` names it — or panics. A monitor port that answers
    /// under another name belongs to another test's server (this one could
    /// not bind it): never taken for this one.
    pub fn wait_healthy(&self, within: Duration) {
        if let Err(why) = self.healthy_within(within) {
            panic!("{why}");
        }
    }

    fn healthy_within(&self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        let mut foreign = None;
        loop {
            if healthz(self.spec.monitor_port) == Some(200) {
                match served_by(self.spec.monitor_port) {
                    Some(name) if name == self.spec.name => return Ok(()),
                    other => foreign = other,
                }
            }
            if Instant::now() > deadline {
                return Err(match foreign {
                    Some(name) => format!(
                        "nats-server {} never answered on its monitor port {}: nats-server {name} \
                         holds it (another test process took the port first)",
                        self.spec.name, self.spec.monitor_port
                    ),
                    None => format!(
                        "nats-server {} did not become healthy within {within:?}",
                        self.spec.name
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

/// The `server_name` the server on `monitor_port` reports (`/varz`).
fn served_by(monitor_port: u16) -> Option<String> {
    let varz = crate::http::get(&format!("127.0.0.1:{monitor_port}"), "/varz").ok()?;
    if varz.status != 200 {
        return None;
    }
    varz.json()["server_name"].as_str().map(str::to_owned)
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn_child(spec: &ServerSpec) -> Child {
    std::fs::create_dir_all(&spec.store_dir).expect("create store dir");
    let mut cmd = Command::new(nats_server_bin());
    cmd.args([
        "--jetstream",
        "--server_name",
        &spec.name,
        "--addr",
        "127.0.0.1",
        "--port",
        &spec.port.to_string(),
        "--http_port",
        &spec.monitor_port.to_string(),
        "--store_dir",
    ])
    .arg(&spec.store_dir)
    .args(&spec.extra_args)
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    spawn_tied(cmd).unwrap_or_else(|e| panic!("start {}: {e}", nats_server_bin().display()))
}

/// Status of `GET /healthz` on a monitoring port, `None` if it does not answer.
pub fn healthz(monitor_port: u16) -> Option<u16> {
    crate::http::get(&format!("127.0.0.1:{monitor_port}"), "/healthz")
        .ok()
        .map(|r| r.status)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server whose monitor port another server holds (as when two test
    /// binaries are handed the same port) is never taken for healthy on that
    /// other server's word.
    #[test]
    fn a_monitor_port_held_by_another_server_is_not_this_ones_health() {
        let holder = NatsServer::start();
        let store = tempfile::tempdir().unwrap();
        let late = NatsServer::spawn(ServerSpec {
            name: format!("late-{}", free_port()),
            port: free_port(),
            monitor_port: holder.spec().monitor_port,
            store_dir: store.path().to_path_buf(),
            extra_args: Vec::new(),
        });
        let why = late
            .healthy_within(Duration::from_secs(2))
            .expect_err("the holder's /healthz is not the late server's");
        assert!(why.contains(&holder.spec().name), "{why}");
    }
}
