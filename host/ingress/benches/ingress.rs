//! Signed GitHub deliveries through the edge at 64 concurrent clients,
//! against the floor measured in the same run: a raw KV create plus a
//! publish with ack through async-nats at the same concurrency. Two edge
//! figures: the path the issue names (verify in WASM, claim, publish with
//! ack — `Edge::admit` then `Edge::dispatch`), and the whole edge as a
//! request runs it (`Edge::deliver`: also the event row and its push,
//! which the design puts before the 2xx).
//!
//!     CARGO_TARGET_DIR=target-ingress cargo bench -p crewlet-ingress --bench ingress
//!
//! Figures go to BENCHMARKS.md (`## Ingress`); nothing here asserts them.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv, stream};
use crewlet_bus::{EVENTS_STREAM, EVENTS_SUBJECTS, NOTIFICATIONS_STREAM, NOTIFICATIONS_SUBJECTS};
use crewlet_company::{Active, ActiveCompany, Company};
use crewlet_coord::{Coord, CoordOptions, Owner};
use crewlet_ingress::sign::github_signature;
use crewlet_ingress::webhook::CLAIM_TTL;
use crewlet_ingress::{Edge, EdgeConfig, Outcome};
use crewlet_plugins::webhook::WebhookPlugin;
use crewlet_plugins::{Manifest, Runtime, RuntimeConfig};
use crewlet_testkit::NatsServer;
use http::HeaderMap;

const CLIENTS: usize = 64;
const PER_CLIENT: usize = 40;
const SECRET: &str = "bench-secret";

struct Run {
    elapsed: Duration,
    latencies: Vec<Duration>,
    /// CPU spent during the run: this process, and the nats-server.
    cpu: Cpu,
}

/// CPU time of this process and of the nats-server child, from /proc.
#[derive(Clone, Copy, Default)]
struct Cpu {
    bench: Duration,
    server: Duration,
}

impl Cpu {
    fn now(server_pid: u32) -> Cpu {
        Cpu {
            bench: proc_cpu("/proc/self/stat"),
            server: proc_cpu(&format!("/proc/{server_pid}/stat")),
        }
    }
    fn since(self, before: Cpu) -> Cpu {
        Cpu {
            bench: self.bench.saturating_sub(before.bench),
            server: self.server.saturating_sub(before.server),
        }
    }
}

/// utime + stime of a `/proc/PID/stat` file (zero where /proc is absent).
fn proc_cpu(path: &str) -> Duration {
    let Ok(stat) = std::fs::read_to_string(path) else {
        return Duration::ZERO;
    };
    // Fields after the command name (which may hold spaces) end with ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    // Clock ticks: 100 per second on every Linux this runs on.
    Duration::from_millis(f.iter().sum::<u64>() * 10)
}

impl Run {
    fn per_sec(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }
    /// Every round as one: latencies pooled, the median round's rate.
    fn pooled(runs: &[Run]) -> Run {
        let mut by_rate: Vec<&Run> = runs.iter().collect();
        by_rate.sort_by(|a, b| a.per_sec().total_cmp(&b.per_sec()));
        let median = by_rate[by_rate.len() / 2];
        let n: usize = runs.iter().map(|r| r.latencies.len()).sum();
        let scale = n as f64 / median.latencies.len() as f64;
        Run {
            elapsed: median.elapsed.mul_f64(scale),
            latencies: runs.iter().flat_map(|r| r.latencies.clone()).collect(),
            cpu: Cpu {
                bench: runs.iter().map(|r| r.cpu.bench).sum(),
                server: runs.iter().map(|r| r.cpu.server).sum(),
            },
        }
    }
    /// CPU per delivery, in µs: (this process, nats-server).
    fn cpu_us(&self) -> (f64, f64) {
        let n = self.latencies.len() as f64;
        (
            self.cpu.bench.as_secs_f64() * 1e6 / n,
            self.cpu.server.as_secs_f64() * 1e6 / n,
        )
    }
    fn pct(&self, p: f64) -> f64 {
        let mut l = self.latencies.clone();
        l.sort();
        let i = ((l.len() as f64 * p).ceil() as usize).clamp(1, l.len()) - 1;
        l[i].as_secs_f64() * 1000.0
    }
}

async fn run<F, Fut>(tag: &str, server_pid: u32, f: F) -> Run
where
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let cpu = Cpu::now(server_pid);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let f = f.clone();
        let tag = tag.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(PER_CLIENT);
            for i in 0..PER_CLIENT {
                let t = Instant::now();
                f(format!("{tag}-{c}-{i}")).await;
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.unwrap());
    }
    Run {
        elapsed: start.elapsed(),
        latencies,
        cpu: Cpu::now(server_pid).since(cpu),
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let server = NatsServer::start();
    let pid = server.pid().expect("nats-server runs");
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = jetstream::new(client.clone());
    for (name, subject) in [
        (NOTIFICATIONS_STREAM, NOTIFICATIONS_SUBJECTS),
        (EVENTS_STREAM, EVENTS_SUBJECTS),
        ("BENCH_FLOOR", "bench.floor.>"),
    ] {
        js.get_or_create_stream(stream::Config {
            name: name.into(),
            subjects: vec![subject.into()],
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let coord = Coord::open(
        client.clone(),
        CoordOptions::new(Owner::incarnation("bench")),
    )
    .await
    .unwrap();
    let floor_kv = js
        .create_key_value(kv::Config {
            bucket: "bench_floor_claims".into(),
            ..Default::default()
        })
        .await
        .unwrap();

    let data = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(RuntimeConfig {
        data_dir: Some(data.path().to_path_buf()),
        ..RuntimeConfig::default()
    })
    .unwrap();
    let manifest = Manifest::load(&root.join("plugins/webhooks/github/plugin.toml")).unwrap();
    let github = Arc::new(WebhookPlugin::load(&runtime, manifest).unwrap());
    let company =
        Company::parse(&std::fs::read_to_string(root.join("examples/company.toml")).unwrap())
            .unwrap();
    let store = Arc::new(crewlet_store::Store::open_in(data.path()).unwrap());
    let store_for_bench = store.clone();
    let publisher = crewlet_observe::Publisher::new("bench", store, js.clone());
    let claim_coord = coord.clone();
    let edge = Arc::new(Edge::new(EdgeConfig {
        node_id: "bench".into(),
        client: client.clone(),
        deliveries: coord.deliveries(),
        publisher: publisher.clone(),
        active: ActiveCompany::new(Some(Active::local(company))),
        plugins: crewlet_plugins::Installed::webhooks_only(vec![github.clone()]),
        secrets: crewlet_secrets::Resolver::new(|_| {
            crewlet_secrets::Lookup::Found(SECRET.to_owned())
        }),
        refused_log: None,
    }));
    let body = bytes::Bytes::from(crewlet_testkit::github::issue_comment(
        "acme/robot",
        7,
        "@ada could you look at why the export stops after the first page? The job log is attached above.",
    ));
    let sig = github_signature(SECRET.as_bytes(), &body);

    let floor_run = |round: usize| {
        let (js, kv) = (js.clone(), floor_kv.clone());
        let body = body.clone();
        let tag = format!("floor{round}");
        async move {
            run(&tag, pid, move |id| {
                let (js, kv, body) = (js.clone(), kv.clone(), body.clone());
                async move {
                    kv.create(&id, "claimed".into()).await.unwrap();
                    js.publish(format!("bench.floor.{id}"), body)
                        .await
                        .unwrap()
                        .await
                        .unwrap();
                }
            })
            .await
        }
    };
    // `INGRESS_BENCH_PROFILE=N`: only the whole edge, N runs, nothing
    // printed — a steady load to attach `perf record -p` to.
    let profile_runs: usize = std::env::var("INGRESS_BENCH_PROFILE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // `full`: the whole edge as `Edge::deliver` runs it (row and push before
    // the 2xx); otherwise the figure's path: admit (verify + parse in WASM)
    // and dispatch (claim, publish, ack) — the steps the floor mirrors.
    let edge_run = |round: usize, full: bool| {
        let (edge, body, sig) = (edge.clone(), body.clone(), sig.clone());
        let tag = format!("edge{round}{}", if full { "w" } else { "p" });
        async move {
            run(&tag, pid, move |id| {
                let (edge, body, sig) = (edge.clone(), body.clone(), sig.clone());
                async move {
                    let mut h = HeaderMap::new();
                    h.insert("content-type", "application/json".parse().unwrap());
                    h.insert("x-github-event", "issue_comment".parse().unwrap());
                    h.insert("x-github-delivery", id.parse().unwrap());
                    h.insert("x-hub-signature-256", sig.parse().unwrap());
                    // Resolved once per request, as the HTTP route does.
                    let route = edge.resolve("github", None).unwrap();
                    if full {
                        let out = edge.deliver(&route, &h, body).await;
                        assert!(matches!(out, Outcome::Accepted(_)), "{out:?}");
                    } else {
                        let deliveries = edge.admit(&route, &h, &body).await.unwrap();
                        for d in deliveries {
                            let published = edge.dispatch("github", None, d).await.unwrap();
                            assert!(published.is_some());
                        }
                    }
                }
            })
            .await
        }
    };
    if profile_runs > 0 {
        let full = std::env::var("INGRESS_BENCH_PROFILE_PATH").is_err();
        for round in 1..=profile_runs {
            edge_run(round, full).await;
        }
        return;
    }
    // The floor and both edge runs in rounds, the order rotating: the
    // machine's speed drifts between runs, so each round's ratio is taken
    // against the floor measured next to it.
    let rounds: usize = std::env::var("INGRESS_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let (mut floors, mut paths, mut wholes) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        for turn in 0..3 {
            match (round + turn) % 3 {
                0 => floors.push(floor_run(round).await),
                1 => paths.push(edge_run(round, false).await),
                _ => wholes.push(edge_run(round, true).await),
            }
        }
    }
    let ratios = |of: &[Run]| -> (Vec<f64>, Vec<f64>) {
        floors
            .iter()
            .zip(of)
            .map(|(f, w)| (w.per_sec() / f.per_sec(), w.pct(0.99) / f.pct(0.99)))
            .unzip()
    };
    let (path_ratios, path_p99_ratios) = ratios(&paths);
    let (whole_ratios, whole_p99_ratios) = ratios(&wholes);
    let floor = Run::pooled(&floors);
    let path = Run::pooled(&paths);
    let whole = Run::pooled(&wholes);
    // Where the time goes: each step of the edge alone, same concurrency.
    let wasm = {
        let (github, body, sig) = (github.clone(), body.clone(), sig.clone());
        run("wasm", pid, move |id| {
            let (github, body, sig) = (github.clone(), body.clone(), sig.clone());
            async move {
                let headers = [
                    ("content-type", "application/json"),
                    ("x-github-event", "issue_comment"),
                    ("x-github-delivery", id.as_str()),
                    ("x-hub-signature-256", sig.as_str()),
                ];
                let secrets = [("github_webhook_secret", SECRET.as_bytes())];
                let req = crewlet_plugins::webhook::Request::new(
                    "/webhooks/github",
                    &headers,
                    &body,
                    &secrets,
                    0,
                );
                github.verify(&req).await.unwrap().unwrap();
                github.parse(&req).await.unwrap().unwrap();
            }
        })
        .await
    };
    let claim = {
        let coord = claim_coord.clone();
        run("claim", pid, move |id| {
            let coord = coord.clone();
            async move {
                let got = coord
                    .claim_delivery(&format!("bench:{id}"), "bench/claimant", CLAIM_TTL)
                    .await
                    .unwrap();
                assert!(matches!(got, crewlet_coord::Answer::Yes(_)));
            }
        })
        .await
    };
    // The event log alone: this store's append, one row after another on
    // one thread (as the publisher's writer does).
    let sqlite = {
        let store = store_for_bench.clone();
        let publisher = publisher.clone();
        tokio::task::spawn_blocking(move || {
            let n = CLIENTS * PER_CLIENT;
            let mut latencies = Vec::with_capacity(n);
            let cpu = Cpu::now(pid);
            let start = Instant::now();
            for i in 0..n {
                let mut ev = publisher.event("webhook_received", serde_json::json!({ "i": i }));
                ev.parties = vec![
                    crewlet_store::Party {
                        party: "source:github".into(),
                        role: "sender".into(),
                    },
                    crewlet_store::Party {
                        party: "node:bench".into(),
                        role: "edge".into(),
                    },
                ];
                let t = Instant::now();
                store.append_event(&ev).unwrap();
                latencies.push(t.elapsed());
            }
            Run {
                elapsed: start.elapsed(),
                latencies,
                cpu: Cpu::now(pid).since(cpu),
            }
        })
        .await
        .unwrap()
    };
    let row = {
        let publisher = publisher.clone();
        run("row", pid, move |id| {
            let publisher = publisher.clone();
            async move {
                let ev = publisher.event("webhook_received", serde_json::json!({ "id": id }));
                publisher.record(ev).await.unwrap();
            }
        })
        .await
    };
    let row_awaited = {
        let publisher = publisher.clone();
        run("rowack", pid, move |id| {
            let publisher = publisher.clone();
            async move {
                let ev = publisher.event("webhook_received", serde_json::json!({ "id": id }));
                publisher.publish(ev).await.unwrap();
            }
        })
        .await
    };
    let n = CLIENTS * PER_CLIENT;
    println!(
        "ingress ({CLIENTS} concurrent clients, {n} deliveries a run of a {} B GitHub issue_comment; floor and edge: median of {rounds} rounds, latencies pooled)",
        body.len()
    );
    // One run: its rate and latencies, then its CPU per delivery.
    let report = |what: &str, r: &Run| {
        let (here, server) = r.cpu_us();
        println!(
            "{what:<46} {:>8.0}/s  p50 {:>6.2} ms  p99 {:>6.2} ms",
            r.per_sec(),
            r.pct(0.50),
            r.pct(0.99)
        );
        println!(
            "{:<46} cpu/delivery {here:>5.0} µs here + {server:>5.0} µs nats-server",
            ""
        );
    };
    report("  floor (KV create + publish w/ ack)", &floor);
    for (what, r) in [
        ("  step: verify + parse in WASM", &wasm),
        ("  step: Coord::claim_delivery (the edge's claim)", &claim),
        ("  step: SQLite append_event, one thread", &sqlite),
        ("  step: event row + broadcast (record)", &row),
        (
            "  step: event row + broadcast (publish, acked)",
            &row_awaited,
        ),
    ] {
        report(what, r);
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let listed = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{:.0}", x * 100.0))
            .collect::<Vec<_>>()
            .join(" ")
    };
    for (what, r, tput, p99) in [
        (
            "  edge: verify + claim + publish (the figure)",
            &path,
            &path_ratios,
            &path_p99_ratios,
        ),
        (
            "  whole edge: + event row and push, then 2xx",
            &whole,
            &whole_ratios,
            &whole_p99_ratios,
        ),
    ] {
        report(what, r);
        println!(
            "{:<46} ratio (median of {rounds} rounds): throughput {:.0} % of floor [{}], p99 {:.2}x floor",
            "",
            100.0 * median(tput),
            listed(tput),
            median(p99)
        );
    }
}
