//! A 3-node nats-server cluster on loopback, whose members can be stopped,
//! restarted and cut off from their peers.
//!
//! Every route between two members runs through a small in-process TCP
//! proxy owned by the dialling side (`proxy[i][j]` carries member `i`'s
//! routes to member `j`). Cutting a member off severs every proxy that
//! touches it — open connections are shut and new ones are closed at once —
//! so a partition needs no root and no network namespace. Members advertise
//! an unreachable cluster address, so gossip can never open a route that
//! bypasses the proxies; only the explicit routes exist.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::nats::{NatsServer, ServerSpec, free_port, healthz};

/// One TCP forwarder that can be severed and healed.
pub struct Proxy {
    port: u16,
    severed: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
    target: Arc<AtomicU16>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub fn start(target: u16) -> Proxy {
        let p = Proxy::unaimed();
        p.aim(target);
        p
    }

    /// Listens now, forwards once [`Proxy::aim`] names the target (until
    /// then, connections are closed at once). Binding every proxy before
    /// the members' ports are picked keeps a proxy from taking a port a
    /// member is about to listen on.
    pub fn unaimed() -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        let severed = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let target = Arc::new(AtomicU16::new(0));
        let (sev, cs, st, tg) = (severed.clone(), conns.clone(), stop.clone(), target.clone());
        std::thread::spawn(move || {
            for inbound in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(inbound) = inbound else { continue };
                let to = tg.load(Ordering::SeqCst);
                if sev.load(Ordering::SeqCst) || to == 0 {
                    let _ = inbound.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", to)) else {
                    let _ = inbound.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                {
                    let mut list = cs.lock().expect("proxy conns");
                    list.retain(|c: &TcpStream| c.peer_addr().is_ok());
                    for s in [&inbound, &outbound] {
                        if let Ok(c) = s.try_clone() {
                            list.push(c);
                        }
                    }
                }
                pump(&inbound, &outbound);
                pump(&outbound, &inbound);
            }
        });
        Proxy {
            port,
            severed,
            conns,
            stop,
            target,
        }
    }

    /// Sets the port this proxy forwards to.
    pub fn aim(&self, target: u16) {
        self.target.store(target, Ordering::SeqCst);
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Shuts every open connection and refuses new ones.
    pub fn sever(&self) {
        self.severed.store(true, Ordering::SeqCst);
        for c in self.conns.lock().expect("proxy conns").drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// Forwards new connections again.
    pub fn heal(&self) {
        self.severed.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.sever();
        // Wake the accept loop so its thread ends.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn pump(from: &TcpStream, to: &TcpStream) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let mut buf = [0u8; 32 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

/// Three JetStream servers clustered on loopback.
pub struct Cluster {
    members: Vec<NatsServer>,
    /// `proxies[i][j]`: member i's routes to member j (`None` on the diagonal).
    proxies: Vec<Vec<Option<Proxy>>>,
    _dir: tempfile::TempDir,
}

pub const CLUSTER_SIZE: usize = 3;

impl Cluster {
    /// Starts three members and waits until each is healthy and all agree
    /// on a JetStream meta leader.
    pub fn start() -> Cluster {
        let dir = tempfile::tempdir().expect("cluster dir");
        let proxies: Vec<Vec<Option<Proxy>>> = (0..CLUSTER_SIZE)
            .map(|i| {
                (0..CLUSTER_SIZE)
                    .map(|j| (i != j).then(Proxy::unaimed))
                    .collect()
            })
            .collect();
        let cluster_ports: Vec<u16> = (0..CLUSTER_SIZE).map(|_| free_port()).collect();
        for (i, row) in proxies.iter().enumerate() {
            for (j, p) in row.iter().enumerate() {
                if let Some(p) = p {
                    debug_assert_ne!(i, j);
                    p.aim(cluster_ports[j]);
                }
            }
        }
        let tag = free_port();
        let members = (0..CLUSTER_SIZE)
            .map(|i| {
                let routes: Vec<String> = (0..CLUSTER_SIZE)
                    .filter(|&j| j != i)
                    .map(|j| {
                        format!(
                            "nats://127.0.0.1:{}",
                            proxies[i][j].as_ref().expect("proxy").port()
                        )
                    })
                    .collect();
                let spec = ServerSpec {
                    name: format!("c{tag}-n{i}"),
                    port: free_port(),
                    monitor_port: free_port(),
                    store_dir: dir.path().join(format!("n{i}")),
                    extra_args: vec![
                        "--cluster_name".into(),
                        format!("c{tag}"),
                        "--cluster".into(),
                        format!("nats://127.0.0.1:{}", cluster_ports[i]),
                        "--cluster_advertise".into(),
                        // Unreachable on purpose: gossip must not bypass the proxies.
                        "127.0.0.1:1".into(),
                        "--routes".into(),
                        routes.join(","),
                    ],
                };
                NatsServer::spawn(spec)
            })
            .collect();
        let cluster = Cluster {
            members,
            proxies,
            _dir: dir,
        };
        cluster.wait_ready(Duration::from_secs(60));
        cluster
    }

    /// Starts a cluster that lives for the rest of the process, for tests
    /// that share one. Its members are spawned from a keeper thread that
    /// never exits: the parent-death signal that reaps a server fires when
    /// the *thread* that spawned it ends, so a cluster started from a test
    /// thread (or a blocking-pool thread) would be killed under later tests.
    pub fn leak_on_keeper_thread() -> &'static Cluster {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let cluster: &'static Cluster = Box::leak(Box::new(Cluster::start()));
            tx.send(cluster).expect("hand the cluster over");
            loop {
                std::thread::park();
            }
        });
        rx.recv().expect("the keeper thread started a cluster")
    }

    pub fn member(&self, i: usize) -> &NatsServer {
        &self.members[i]
    }

    pub fn url(&self, i: usize) -> String {
        self.members[i].url()
    }

    pub fn urls(&self) -> Vec<String> {
        self.members.iter().map(NatsServer::url).collect()
    }

    /// The member's server name (for stream leader placement).
    pub fn server_name(&self, i: usize) -> &str {
        &self.members[i].spec().name
    }

    /// Kills a member (a crash).
    pub fn stop(&mut self, i: usize) {
        self.members[i].kill();
    }

    /// Restarts a stopped member with its store and waits for the cluster.
    /// The member dies with the calling thread (see [`Cluster::leak_on_keeper_thread`]).
    pub fn restart(&mut self, i: usize) {
        self.restart_all(&[i]);
    }

    /// Restarts every member in `ids`, then waits for the cluster once.
    ///
    /// Restarting stopped members one at a time waits, after the first, for
    /// a cluster with a member still down: every replicated stream must be
    /// current on the two that run while one of them catches up, which on
    /// a loaded 2-core machine once took longer than the wait (CI,
    /// 2026-12-01). Bringing them all back first waits for the ordinary
    /// full-membership recovery instead.
    pub fn restart_all(&mut self, ids: &[usize]) {
        for &i in ids {
            self.members[i].restart();
        }
        self.wait_ready(Duration::from_secs(60));
    }

    /// Cuts member `i` off from both peers (client connections stay up).
    pub fn isolate(&self, i: usize) {
        for j in 0..CLUSTER_SIZE {
            if let Some(p) = &self.proxies[i][j] {
                p.sever();
            }
            if let Some(p) = &self.proxies[j][i] {
                p.sever();
            }
        }
    }

    /// Reconnects member `i` to its peers.
    pub fn heal(&self, i: usize) {
        for j in 0..CLUSTER_SIZE {
            if let Some(p) = &self.proxies[i][j] {
                p.heal();
            }
            if let Some(p) = &self.proxies[j][i] {
                p.heal();
            }
        }
    }

    /// Waits until every running member is healthy and they agree on a
    /// meta leader (members stopped with [`Cluster::stop`] are not waited for).
    pub fn wait_ready(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            for m in &self.members {
                if m.pid().is_some_and(|pid| !alive(pid)) {
                    panic!(
                        "cluster member {} exited while starting (a port it was given may have been taken)",
                        m.spec().name
                    );
                }
            }
            // Stopped members are left out: a restart waits for the members
            // that run, not for the ones still down.
            let running: Vec<&NatsServer> =
                self.members.iter().filter(|m| m.pid().is_some()).collect();
            let health: Vec<Option<u16>> = running
                .iter()
                .map(|m| healthz(m.spec().monitor_port))
                .collect();
            let healthy = health.iter().all(|h| *h == Some(200));
            let leaders: Vec<Option<String>> = running
                .iter()
                .map(|m| meta_leader(m.spec().monitor_port))
                .collect();
            let agreed = leaders[0].is_some() && leaders.iter().all(|l| l == &leaders[0]);
            if healthy && agreed {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "cluster not ready within {within:?}: meta leaders {leaders:?}, /healthz {health:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The JetStream meta leader a member reports on `/jsz`.
pub fn meta_leader(monitor_port: u16) -> Option<String> {
    let r = crate::http::get(&format!("127.0.0.1:{monitor_port}"), "/jsz").ok()?;
    if r.status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
    v.pointer("/meta_cluster/leader")
        .and_then(|l| l.as_str())
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
}

/// Whether a child process is still running (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}
