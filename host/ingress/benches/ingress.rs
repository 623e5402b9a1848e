//! Signed GitHub deliveries through the whole edge (verify in WASM, claim,
//! publish with ack, event row + broadcast) at 64 concurrent clients,
//! against the floor measured in the same run: a raw KV create plus a
//! publish with ack through async-nats at the same concurrency.
//!
//!     CARGO_TARGET_DIR=target-ingress cargo bench -p crewlet-ingress --bench ingress
//!
//! Figures go to BENCHMARKS.md (`## Ingress`); nothing here asserts them.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv, stream};
use axum::http::HeaderMap;
use crewlet_company::{Active, ActiveCompany, Company};
use crewlet_coord::{Coord, CoordOptions, Owner};
use crewlet_ingress::sign::github_signature;
use crewlet_ingress::webhook::CLAIM_TTL;
use crewlet_ingress::{Edge, EdgeConfig, Outcome};
use crewlet_plugins::webhook::WebhookPlugin;
use crewlet_plugins::{Manifest, Runtime, RuntimeConfig};
use crewlet_testkit::NatsServer;

const CLIENTS: usize = 64;
const PER_CLIENT: usize = 40;
const SECRET: &str = "bench-secret";

struct Run {
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Run {
    fn per_sec(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }
    fn pct(&self, p: f64) -> f64 {
        let mut l = self.latencies.clone();
        l.sort();
        let i = ((l.len() as f64 * p).ceil() as usize).clamp(1, l.len()) - 1;
        l[i].as_secs_f64() * 1000.0
    }
}

async fn run<F, Fut>(tag: &str, f: F) -> Run
where
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
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
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = jetstream::new(client.clone());
    for (name, subject) in [
        ("CREWLET_NOTIFICATIONS", "crewlet.notifications.>"),
        ("CREWLET_EVENTS", "crewlet.events.>"),
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
        coord,
        publisher: publisher.clone(),
        active: ActiveCompany::new(Some(Active::local(company))),
        webhooks: vec![github.clone()],
        secrets: Arc::new(|_| Some(SECRET.to_owned())),
    }));
    let body = bytes::Bytes::from_static(
        br#"{"action":"created","issue":{"number":7},"comment":{"body":"please look @ada"},"repository":{"full_name":"acme/robot"}}"#,
    );
    let sig = github_signature(SECRET.as_bytes(), &body);

    let floor = {
        let (js, kv) = (js.clone(), floor_kv.clone());
        let body = body.clone();
        run("floor", move |id| {
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
    };
    let whole = {
        let (edge, body, sig) = (edge.clone(), body.clone(), sig.clone());
        run("edge", move |id| {
            let (edge, body, sig) = (edge.clone(), body.clone(), sig.clone());
            async move {
                let mut h = HeaderMap::new();
                h.insert("content-type", "application/json".parse().unwrap());
                h.insert("x-github-event", "issue_comment".parse().unwrap());
                h.insert("x-github-delivery", id.parse().unwrap());
                h.insert("x-hub-signature-256", sig.parse().unwrap());
                let out = edge.deliver("github", None, &h, body).await;
                assert!(matches!(out, Outcome::Accepted(_)), "{out:?}");
            }
        })
        .await
    };
    // Where the time goes: each step of the edge alone, same concurrency.
    let wasm = {
        let (github, body, sig) = (github.clone(), body.clone(), sig.clone());
        run("wasm", move |id| {
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
        run("claim", move |id| {
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
            }
        })
        .await
        .unwrap()
    };
    let row = {
        let publisher = publisher.clone();
        run("row", move |id| {
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
        run("rowack", move |id| {
            let publisher = publisher.clone();
            async move {
                let ev = publisher.event("webhook_received", serde_json::json!({ "id": id }));
                publisher.publish(ev).await.unwrap();
            }
        })
        .await
    };
    let n = CLIENTS * PER_CLIENT;
    println!("ingress ({CLIENTS} concurrent clients, {n} deliveries each run)");
    println!(
        "  floor (KV create + publish w/ ack): {:>8.0}/s  p50 {:>6.2} ms  p99 {:>6.2} ms",
        floor.per_sec(),
        floor.pct(0.50),
        floor.pct(0.99)
    );
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
        println!(
            "{what:<46} {:>8.0}/s  p50 {:>6.2} ms  p99 {:>6.2} ms",
            r.per_sec(),
            r.pct(0.50),
            r.pct(0.99)
        );
    }
    println!(
        "  whole edge (verify+claim+publish+row): {:>5.0}/s  p50 {:>6.2} ms  p99 {:>6.2} ms",
        whole.per_sec(),
        whole.pct(0.50),
        whole.pct(0.99)
    );
    println!(
        "  ratio: throughput {:.0} % of floor, p99 {:.2}x floor",
        100.0 * whole.per_sec() / floor.per_sec(),
        whole.pct(0.99) / floor.pct(0.99)
    );
}
