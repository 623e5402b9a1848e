//! The sandbox under attack: the healthy GitHub route's throughput and p99
//! with 16 clients, alone and with a hostile plugin hammered by 16 more
//! clients, and `/health`'s p99 throughout — each scenario on a fresh node
//! (release binary, one nats-server), all in one run so the ratios compare
//! like with like.
//!
//! Every attack is measured twice against one alone baseline: with the
//! attacking clients' threads at the node's own priority, and at nice 19.
//! On one 2-core machine the attacking clients are themselves CPU that the
//! node and GitHub's senders have to share — an attacker on a machine of
//! its own costs them only its requests — so the second pass approximates
//! that: the node, its broker and GitHub's senders are served first, the
//! attackers get what is left, and every request they get out still costs
//! the node what it costs. GitHub's senders and the `/health` poller keep
//! their priority in both.
//!
//! `cargo bench --bench sandbox` (set `SANDBOX_SECONDS` to change the 5 s
//! per scenario). Printed per scenario: GitHub req/s and p50/p99, `/health`
//! p50/p99, and the ratios against the alone baseline of its pass.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crewlet_ingress::sign::github_signature;
use crewlet_testkit::{NatsServer, PluginsDir, free_port, http};

const GH_SECRET: &str = "bench-github-secret";
const CLIENTS: usize = 16;

struct Scenario {
    name: &'static str,
    /// The body sent to the hostile route, if it is attacked.
    attack: Option<&'static str>,
    env: &'static [(&'static str, &'static str)],
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "alone",
        attack: None,
        env: &[],
    },
    Scenario {
        name: "control: 16 clients on an unserved route (404)",
        attack: Some("@unserved"),
        env: &[],
    },
    Scenario {
        name: "verify loops (production: breaker on)",
        attack: Some("verify-loop"),
        env: &[],
    },
    Scenario {
        name: "verify loops, breaker off, guest threads",
        attack: Some("verify-loop"),
        env: &[("CREWLET_BREAKER_FAULTS", "0")],
    },
    Scenario {
        name: "verify loops, breaker off, shared I/O threads",
        attack: Some("verify-loop"),
        env: &[
            ("CREWLET_BREAKER_FAULTS", "0"),
            ("CREWLET_GUEST_THREADS", "shared"),
        ],
    },
    Scenario {
        name: "parse loops (production: breaker on)",
        attack: Some("loop"),
        env: &[],
    },
    Scenario {
        name: "parse loops, breaker off, guest threads",
        attack: Some("loop"),
        env: &[("CREWLET_BREAKER_FAULTS", "0")],
    },
    Scenario {
        name: "allocates to its cap (production: breaker on)",
        attack: Some("allocate-1gib"),
        env: &[],
    },
    Scenario {
        name: "allocates to its cap, breaker off, guest threads",
        attack: Some("allocate-1gib"),
        env: &[("CREWLET_BREAKER_FAULTS", "0")],
    },
];

struct Node {
    child: Child,
    addr: String,
}

impl Drop for Node {
    fn drop(&mut self) {
        // SAFETY: our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn start(server: &NatsServer, dir: &Path, plugins: &Path, env: &[(&str, &str)]) -> Node {
    let port = free_port();
    let config = dir.join("node.toml");
    std::fs::write(
        &config,
        format!(
            "[node]\nroles = [\"data\", \"ingress\", \"workers\"]\n[api]\nport = {port}\n[stream]\nurl = \"{}\"\n",
            server.url()
        ),
    )
    .unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let company = std::fs::read_to_string(root.join("examples/company.toml")).unwrap()
        + "\n[integrations.hostile]\nplugin = \"hostile-webhook\"\nsecret = \"HOSTILE_SECRET\"\n";
    std::fs::write(dir.join("company.toml"), company).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_crewlet"));
    cmd.arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--company")
        .arg(dir.join("company.toml"))
        .arg("--plugins")
        .arg(plugins)
        .env("CREWLET_LOG", "error")
        .env("CREWLET_BOOTSTRAP_TOKEN", http::OPERATOR_TOKEN)
        .env("GITHUB_WEBHOOK_SECRET", GH_SECRET)
        .env("HOSTILE_SECRET", "bench-hostile-secret")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let node = Node {
        child: cmd.spawn().unwrap(),
        addr: format!("127.0.0.1:{port}"),
    };
    let started = Instant::now();
    while !http::get(&node.addr, "/ready").is_ok_and(|r| r.status == 200) {
        assert!(started.elapsed() < Duration::from_secs(60), "never ready");
        std::thread::sleep(Duration::from_millis(5));
    }
    node
}

/// One keep-alive connection; answers (status, elapsed).
struct Conn {
    addr: String,
    reader: Option<BufReader<TcpStream>>,
}

impl Conn {
    fn new(addr: &str) -> Conn {
        Conn {
            addr: addr.to_string(),
            reader: None,
        }
    }

    fn send(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> u16 {
        for _ in 0..2 {
            if self.reader.is_none() {
                let s = TcpStream::connect(&self.addr).unwrap();
                s.set_nodelay(true).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                self.reader = Some(BufReader::new(s));
            }
            match self.exchange(method, path, headers, body) {
                Some(status) => return status,
                None => self.reader = None,
            }
        }
        0
    }

    fn exchange(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Option<u16> {
        let reader = self.reader.as_mut()?;
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\n",
            self.addr,
            http::OPERATOR_TOKEN,
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let stream = reader.get_mut();
        stream.write_all(head.as_bytes()).ok()?;
        stream.write_all(body).ok()?;
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let status: u16 = line.split_whitespace().nth(1)?.parse().ok()?;
        let mut length = 0usize;
        let mut close = false;
        loop {
            line.clear();
            reader.read_line(&mut line).ok()?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let lower = l.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse().ok()?;
            }
            if lower.starts_with("connection:") && lower.contains("close") {
                close = true;
            }
        }
        let mut sink = vec![0u8; length];
        reader.read_exact(&mut sink).ok()?;
        if close {
            self.reader = None;
        }
        Some(status)
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

struct Figures {
    rps: f64,
    p50: Duration,
    p99: Duration,
    health_p50: Duration,
    health_p99: Duration,
    accepted: u64,
}

/// The attacking clients' niceness in each pass: the node's own, then last.
const ATTACKER_NICENESS: [i32; 2] = [0, 19];

fn run(
    node: &Node,
    scenario: usize,
    attack: Option<&'static str>,
    seconds: u64,
    nice: i32,
) -> Figures {
    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicU64::new(0));
    let mut github = Vec::new();
    for c in 0..CLIENTS {
        let (addr, stop, accepted) = (node.addr.clone(), stop.clone(), accepted.clone());
        github.push(std::thread::spawn(move || {
            let mut conn = Conn::new(&addr);
            let mut lat = Vec::new();
            let body = br#"{"action":"created","comment":{"body":"@ada hi"},"issue":{"number":1},"repository":{"full_name":"o/r"}}"#;
            let sig = github_signature(GH_SECRET.as_bytes(), body);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                // Unique across scenarios: they share one broker, and its
                // claims bucket remembers every id for five minutes.
                let id = format!("bench-{scenario}-{c}-{i}");
                let t = Instant::now();
                let status = conn.send(
                    "POST",
                    "/webhooks/github",
                    &[
                        ("X-GitHub-Event", "issue_comment"),
                        ("X-GitHub-Delivery", &id),
                        ("X-Hub-Signature-256", &sig),
                        ("Content-Type", "application/json"),
                    ],
                    body,
                );
                lat.push(t.elapsed());
                if status == 202 {
                    accepted.fetch_add(1, Ordering::Relaxed);
                }
            }
            lat
        }));
    }
    let mut hostile = Vec::new();
    if let Some(what) = attack {
        for _ in 0..CLIENTS {
            let (addr, stop) = (node.addr.clone(), stop.clone());
            hostile.push(std::thread::spawn(move || {
                crewlet_os::lower_thread_priority(nice).unwrap();
                let mut conn = Conn::new(&addr);
                // `@unserved`: the attack's HTTP traffic alone, no plugin.
                let route = if what == "@unserved" {
                    "/webhooks/unserved"
                } else {
                    "/webhooks/hostile"
                };
                while !stop.load(Ordering::Relaxed) {
                    let status = conn.send(
                        "POST",
                        route,
                        &[("Content-Type", "text/plain")],
                        what.as_bytes(),
                    );
                    if status == 503 {
                        // Quarantined: a sender honouring Retry-After waits;
                        // an attacker does not.
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }));
        }
    }
    let health = {
        let (addr, stop) = (node.addr.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut conn = Conn::new(&addr);
            let mut lat = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                conn.send("GET", "/health", &[], b"");
                lat.push(t.elapsed());
                std::thread::sleep(Duration::from_millis(10));
            }
            lat
        })
    };
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut lat: Vec<Duration> = github.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let elapsed = started.elapsed();
    for t in hostile {
        t.join().unwrap();
    }
    let mut hl = health.join().unwrap();
    lat.sort();
    hl.sort();
    let accepted = accepted.load(Ordering::Relaxed);
    Figures {
        rps: accepted as f64 / elapsed.as_secs_f64(),
        p50: percentile(&lat, 0.5),
        p99: percentile(&lat, 0.99),
        health_p50: percentile(&hl, 0.5),
        health_p99: percentile(&hl, 0.99),
        accepted,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let seconds: u64 = std::env::var("SANDBOX_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let server = NatsServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let plugins = PluginsDir::new(tmp.path().join("plugins"));
    plugins
        .add("github", "plugins/webhooks/github/plugin.toml")
        .add("hostile", "plugins/testdata/hostile-webhook/plugin.toml")
        // The rest of what the example company names (a node refuses a
        // company its plugins cannot run).
        .add("slack", "plugins/webhooks/slack/plugin.toml")
        .add("scripted", "plugins/providers/scripted/plugin.toml")
        .add("notebook", "plugins/modules/notebook/plugin.toml");
    println!(
        "sandbox: {CLIENTS} clients on /webhooks/github (+{CLIENTS} on /webhooks/hostile under attack), {seconds} s per scenario"
    );
    let mut scenario = 0;
    let mut baseline: Option<Figures> = None;
    for nice in ATTACKER_NICENESS {
        for s in SCENARIOS {
            if s.attack.is_none() && baseline.is_some() {
                continue;
            }
            scenario += 1;
            let dir = tmp.path().join(format!("s{scenario}"));
            std::fs::create_dir_all(&dir).unwrap();
            let node = start(&server, &dir, plugins.path(), s.env);
            let f = run(&node, scenario, s.attack, seconds, nice);
            drop(node);
            let ratio = baseline
                .as_ref()
                .map(|b| {
                    format!(
                        "  throughput {:.0}% of alone, p99 {:.2}x alone",
                        100.0 * f.rps / b.rps,
                        ms(f.p99) / ms(b.p99)
                    )
                })
                .unwrap_or_default();
            let name = match s.attack {
                Some(_) => format!("{} [attackers nice {nice}]", s.name),
                None => s.name.to_string(),
            };
            println!(
                "{:<70} github {:>7.0} req/s ({:>6} accepted) p50 {:>6.2} ms p99 {:>7.2} ms | /health p50 {:>5.2} ms p99 {:>6.2} ms{ratio}",
                name,
                f.rps,
                f.accepted,
                ms(f.p50),
                ms(f.p99),
                ms(f.health_p50),
                ms(f.health_p99),
            );
            if baseline.is_none() {
                baseline = Some(f);
            }
        }
    }
}
