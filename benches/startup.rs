//! Start-up figures for `crewlet run`: time to `/ready` 200 on an empty and
//! on a warm data dir, and the idle node's peak RSS, against a bare
//! nats-server measured in the same run (spawn → accepting clients).
//!
//!     cargo bench --bench startup
//!
//! Figures go to BENCHMARKS.md; nothing here asserts them.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crewlet_testkit::{free_port, http, nats_server_bin};

const RUNS: usize = 10;

fn main() {
    let bare = measure(RUNS, |_| bare_nats_start());
    let cold = measure(RUNS, |_| {
        let dir = tempfile::tempdir().unwrap();
        let (t, _) = node_start(dir.path(), false);
        t
    });
    let warm_dir = tempfile::tempdir().unwrap();
    let _ = node_start(warm_dir.path(), false);
    let warm = measure(RUNS, |_| node_start(warm_dir.path(), false).0);
    let dir = tempfile::tempdir().unwrap();
    let (_, rss) = node_start(dir.path(), true);
    let (node_rss, broker_rss) = rss.expect("rss measured");

    println!("startup ({RUNS} runs each, median / p90)");
    println!(
        "  bare nats-server to accepting:   {:>7.1} ms / {:>7.1} ms   (baseline)",
        ms(bare.0),
        ms(bare.1)
    );
    println!(
        "  crewlet run → /ready, empty dir: {:>7.1} ms / {:>7.1} ms   ({:.2}× baseline)",
        ms(cold.0),
        ms(cold.1),
        cold.0.as_secs_f64() / bare.0.as_secs_f64()
    );
    println!(
        "  crewlet run → /ready, warm dir:  {:>7.1} ms / {:>7.1} ms   ({:.2}× baseline)",
        ms(warm.0),
        ms(warm.1),
        warm.0.as_secs_f64() / bare.0.as_secs_f64()
    );
    println!(
        "idle node after 2 s: crewlet peak RSS {node_rss} KiB, its nats-server peak RSS {broker_rss} KiB"
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Median and p90 of `runs` samples.
fn measure(runs: usize, mut f: impl FnMut(usize) -> Duration) -> (Duration, Duration) {
    let mut samples: Vec<Duration> = (0..runs).map(&mut f).collect();
    samples.sort();
    (samples[runs / 2], samples[(runs * 9) / 10 - 1])
}

fn bare_nats_start() -> Duration {
    let store = tempfile::tempdir().unwrap();
    let port = free_port();
    let started = Instant::now();
    let mut child = Command::new(nats_server_bin())
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(store.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let t = started.elapsed();
    child.kill().unwrap();
    child.wait().unwrap();
    t
}

/// Starts a node on `data_dir`, answers the time to `/ready` 200 and, when
/// asked, the peak RSS (KiB) of the node and its broker after 2 s idle.
fn node_start(data_dir: &Path, rss: bool) -> (Duration, Option<(u64, u64)>) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let config = data_dir.with_extension("toml");
    std::fs::write(&config, format!("[api]\nport = {port}\n")).unwrap();
    let started = Instant::now();
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_crewlet"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(data_dir)
        .env("CREWLET_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    loop {
        if http::get(&addr, "/ready").is_ok_and(|r| r.status == 200) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "node never ready"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let t = started.elapsed();
    let rss = rss.then(|| {
        std::thread::sleep(Duration::from_secs(2));
        let health = http::get(&addr, "/health").unwrap().json();
        let broker = health["stream"]["server"]["pid"].as_u64().unwrap();
        (vm_hwm(child.id() as u64), vm_hwm(broker))
    });
    // SAFETY: our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    child.wait().unwrap();
    (t, rss)
}

fn vm_hwm(pid: u64) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}
