//! The state log's figures (BENCHMARKS.md, "The replicated estate"):
//! applier throughput against a raw ordered consumer reading the same
//! stream in the same run; replication lag from publish to applied on every
//! node of a 3-node cluster; snapshot adoption time and size; `/usage`'s
//! read over DAYS × SEATS.
//!
//! `cargo bench -p crewlet-statelog --bench statelog` (sizes from the
//! environment: RECORDS, ROUNDS, LAG_RECORDS, SNAPSHOT_ROWS, DAYS, SEATS;
//! FIGURES picks some of `throughput,lag,adoption,usage`, all by default).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use crewlet_coord::{Coord, CoordOptions, Owner};
use crewlet_statelog::snapshot::{self, Adopter};
use crewlet_statelog::usage::{TokensObject, TurnsObject, Usage, UsageObject, UsageQuery};
use crewlet_statelog::{
    Applier, ApplierParts, DomainState, Estate, Incoming, Local, PositionBook, append,
    ensure_stream,
};
use crewlet_testkit::{Cluster, NatsServer};
use futures::StreamExt;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn tokens(node: &str, day: &str, seat: &str, n: u64) -> UsageObject {
    UsageObject::Tokens(TokensObject {
        node: node.into(),
        day: day.into(),
        seat: seat.into(),
        role: format!("role{}", seat.len() % 7).into(),
        phase: "executor".into(),
        model: format!("model{}", n % 3).into(),
        slot: Some(format!("model{}#keyless", n % 3).into()),
        calls: 1,
        input_tokens: n,
        output_tokens: n / 10,
    })
}

struct Held {
    _dir: tempfile::TempDir,
    estate: Arc<Estate>,
    applier: Applier,
}

fn applier(
    js: &jetstream::Context,
    node: &str,
    book: Option<PositionBook>,
    adopter: Option<Adopter>,
) -> Held {
    let dir = tempfile::tempdir().unwrap();
    applier_in(dir, js, node, book, adopter, 1)
}

fn applier_in(
    dir: tempfile::TempDir,
    js: &jetstream::Context,
    node: &str,
    book: Option<PositionBook>,
    adopter: Option<Adopter>,
    replicas: usize,
) -> Held {
    let estate = Arc::new(Estate::open_in(dir.path()).unwrap());
    let local = Arc::new(Local::open_in(dir.path()).unwrap());
    let applier = Applier::start(ApplierParts {
        js: js.clone(),
        estate: estate.clone(),
        local,
        domain: Arc::new(Usage),
        book,
        adopter,
        node: node.into(),
        replicas,
    });
    Held {
        _dir: dir,
        estate,
        applier,
    }
}

async fn until(applier: &Applier, position: u64) {
    let mut rx = applier.watch();
    tokio::time::timeout(
        Duration::from_secs(600),
        rx.wait_for(|s| s.position >= position && s.state == DomainState::Applying),
    )
    .await
    .expect("applied within 10 min")
    .unwrap();
}

/// Publishes `objects` pipelined (256 acks in flight); answers the last position.
async fn publish_all(js: &jetstream::Context, objects: impl Iterator<Item = UsageObject>) -> u64 {
    let mut last = 0;
    let mut pending = Vec::new();
    for o in objects {
        pending.push(
            js.publish(o.subject(), o.record().to_bytes().into())
                .await
                .unwrap(),
        );
        if pending.len() == 256 {
            for ack in pending.drain(..) {
                last = last.max(ack.await.unwrap().sequence);
            }
        }
    }
    for ack in pending {
        last = last.max(ack.await.unwrap().sequence);
    }
    last
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// The applier against a raw ordered consumer over the same stream, in
/// ROUNDS alternating pairs. The raw reader does what any reader of the log
/// must: it reads each record's position and decodes the record. Each
/// applier's estate file is opened before its clock starts.
async fn throughput() {
    let n = env("RECORDS", 50_000);
    let rounds = env("ROUNDS", 3).max(1);
    let server = NatsServer::start();
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    let stream = ensure_stream(&js, &Usage, 1).await.unwrap();
    let last = publish_all(
        &js,
        (0..n).map(|i| tokens("n1", "2026-12-06", &format!("s{i}"), i as u64)),
    )
    .await;
    let mut ratios = Vec::new();
    for round in 1..=rounds {
        let raw = {
            let began = Instant::now();
            let consumer = stream
                .create_consumer(jetstream::consumer::pull::OrderedConfig::default())
                .await
                .unwrap();
            let mut messages = consumer.messages().await.unwrap();
            let mut seen = 0;
            while seen < n {
                let m = messages.next().await.unwrap().unwrap();
                let position = m.info().unwrap().stream_sequence;
                // The decoding the applier does too: the head, then the
                // body as the domain's own type.
                let record = Incoming::decode(m.payload.clone()).unwrap();
                let object = UsageObject::from_record(&record).unwrap();
                std::hint::black_box((position, object));
                seen += 1;
            }
            n as f64 / began.elapsed().as_secs_f64()
        };
        let applied = {
            let dir = tempfile::tempdir().unwrap();
            let estate = Arc::new(Estate::open_in(dir.path()).unwrap());
            let local = Arc::new(Local::open_in(dir.path()).unwrap());
            let began = Instant::now();
            let applier = Applier::start(ApplierParts {
                js: js.clone(),
                estate,
                local,
                domain: Arc::new(Usage),
                book: None,
                adopter: None,
                node: "n1".into(),
                replicas: 1,
            });
            until(&applier, last).await;
            let rate = n as f64 / began.elapsed().as_secs_f64();
            applier.stop().await;
            rate
        };
        let ratio = 100.0 * applied / raw;
        ratios.push(ratio);
        println!(
            "throughput round {round}: {n} records; raw ordered consumer (position + decode) {raw:.0}/s, applier {applied:.0}/s = {ratio:.0} %"
        );
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "throughput: median of {rounds} rounds {:.0} %",
        ratios[ratios.len() / 2]
    );
}

/// A 3-node cluster can refuse for a moment while its peers settle or a
/// stream's leader is elected ("no suitable peers", "no stream found"):
/// the bench retries, said on stderr. An append is retried with the same
/// record (its operation id dedupes it) and timed from the first attempt.
async fn retried<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    what: &str,
    mut attempt: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match attempt().await {
            Ok(v) => return v,
            Err(e) if Instant::now() < deadline => {
                eprintln!("{what}: {e}; retried");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

async fn lag() {
    let n = env("LAG_RECORDS", 2_000);
    let cluster = Cluster::start();
    cluster.wait_ready(Duration::from_secs(60));
    let mut nodes = Vec::new();
    let first = jetstream::new(async_nats::connect(cluster.url(0)).await.unwrap());
    retried("creating the R3 log", || ensure_stream(&first, &Usage, 3)).await;
    for i in 0..3 {
        let js = jetstream::new(async_nats::connect(cluster.url(i)).await.unwrap());
        while js.get_stream(crewlet_bus::USAGE_LOG_STREAM).await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let dir = tempfile::tempdir().unwrap();
        nodes.push((
            js.clone(),
            applier_in(dir, &js, &format!("n{i}"), None, None, 3),
        ));
    }
    for (_, held) in &nodes {
        let mut rx = held.applier.watch();
        rx.wait_for(|s| s.state == DomainState::Applying)
            .await
            .unwrap();
    }
    let watchers: Vec<_> = nodes
        .iter()
        .map(|(_, held)| {
            let mut rx = held.applier.watch();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                loop {
                    if rx.changed().await.is_err() {
                        return seen;
                    }
                    let p = rx.borrow().position;
                    seen.push((p, Instant::now()));
                    if p >= n as u64 {
                        return seen;
                    }
                }
            })
        })
        .collect();
    let js = &nodes[0].0;
    let mut sent = Vec::with_capacity(n);
    for i in 0..n {
        let o = tokens("n0", "2026-12-06", &format!("lag{i}"), i as u64);
        let at = Instant::now();
        let (subject, record) = (o.subject(), o.record());
        let seq = retried("appending", || append(js, &subject, &record)).await;
        sent.push((seq, at));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut lags = Vec::new();
    for w in watchers {
        let seen = w.await.unwrap();
        for (seq, at) in &sent {
            if let Some((_, when)) = seen.iter().find(|(p, _)| p >= seq) {
                lags.push(when.saturating_duration_since(*at));
            }
        }
    }
    lags.sort();
    println!(
        "replication lag, 3-node R3 cluster, {n} records x 3 appliers: p50 {:?}, p99 {:?}, max {:?}",
        pct(&lags, 0.50),
        pct(&lags, 0.99),
        lags.last().unwrap()
    );
    for (_, held) in &nodes {
        held.applier.stop().await;
    }
}

async fn adoption() {
    let rows = env("SNAPSHOT_ROWS", 200_000);
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = jetstream::new(client.clone());
    ensure_stream(&js, &Usage, 1).await.unwrap();
    let book = PositionBook::new(
        Coord::open(
            client.clone(),
            CoordOptions::new(Owner::incarnation("bench")),
        )
        .await
        .unwrap(),
    );
    let donor = applier(&js, "n1", Some(book.clone()), None);
    let last = publish_all(
        &js,
        (0..rows).map(|i| {
            tokens(
                "n1",
                &format!("2026-{:02}-{:02}", 1 + i % 12, 1 + i % 28),
                &format!("seat{i}"),
                i as u64,
            )
        }),
    )
    .await;
    until(&donor.applier, last).await;
    let serving = snapshot::serve(snapshot::Donor {
        client: client.clone(),
        js: js.clone(),
        estate: donor.estate.clone(),
        node: "n1".into(),
        staging: donor._dir.path().to_path_buf(),
        book: Some(book.clone()),
        domains: vec![donor.applier.watch()],
    })
    .await
    .unwrap();
    while book.positions("usage").await.unwrap().get("n1") != Some(&last) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    crewlet_statelog::trim::trim(&js, &book, &Usage, "bench")
        .await
        .unwrap();
    let size = std::fs::metadata(donor.estate.path()).unwrap().len();
    let dir = tempfile::tempdir().unwrap();
    let adopter = Adopter {
        client: client.clone(),
        js: js.clone(),
        book: book.clone(),
        node: "n2".into(),
        staging: dir.path().to_path_buf(),
    };
    let began = Instant::now();
    let joiner = applier_in(dir, &js, "n2", Some(book), Some(adopter), 1);
    until(&joiner.applier, last).await;
    println!(
        "snapshot adoption: {rows} rows, estate file {:.1} MiB: asked → installed → applying in {:?}",
        size as f64 / 1048576.0,
        began.elapsed()
    );
    serving.abort();
    donor.applier.stop().await;
    joiner.applier.stop().await;
}

async fn usage_read() {
    let (days, seats) = (env("DAYS", 181), env("SEATS", 1_000));
    let server = NatsServer::start();
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    ensure_stream(&js, &Usage, 1).await.unwrap();
    let held = applier(&js, "n1", None, None);
    let start = jiff::civil::date(2026, 6, 9);
    let objects = (0..days).flat_map(move |d| {
        let day = start
            .checked_add(jiff::Span::new().days(d as i64))
            .unwrap()
            .to_string();
        (0..seats).flat_map(move |s| {
            let seat = format!("seat{s}");
            [
                tokens("n1", &day, &seat, (d * s) as u64),
                UsageObject::Turns(TurnsObject {
                    node: "n1".into(),
                    day: day.as_str().into(),
                    seat: seat.as_str().into(),
                    role: "eng".into(),
                    outcome: "delivered".into(),
                    turns: 3,
                }),
            ]
        })
    });
    let last = publish_all(&js, objects).await;
    until(&held.applier, last).await;
    for (period, by) in [("day", "seat"), ("month", "role"), ("week", "model")] {
        let q = UsageQuery::parse(Some(period), Some(by), None, None).unwrap();
        let mut times = Vec::new();
        let mut rows = 0;
        for _ in 0..20 {
            let began = Instant::now();
            rows = q.run(&held.estate.reader().unwrap()).unwrap().len();
            times.push(began.elapsed());
        }
        times.sort();
        println!(
            "/usage read over {days} days x {seats} seats, period={period} by={by}: {rows} rows, p50 {:?}, p99 {:?}",
            pct(&times, 0.5),
            pct(&times, 0.99)
        );
    }
    held.applier.stop().await;
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let figures =
        std::env::var("FIGURES").unwrap_or_else(|_| "throughput,lag,adoption,usage".into());
    let wanted = |f: &str| figures.split(',').any(|w| w.trim() == f);
    rt.block_on(async {
        if wanted("throughput") {
            throughput().await;
        }
        if wanted("lag") {
            lag().await;
        }
        if wanted("adoption") {
            adoption().await;
        }
        if wanted("usage") {
            usage_read().await;
        }
    });
}
