//! How long one node takes to acquire, equip (a host that does nothing) and
//! attach N seats on a real nats-server, and to give them all back; then
//! the hand-over when a second node joins: how long each seat the first
//! node gives back stays unowned (its release to the peer's acquire, both
//! on the broker's clock, read from a watch of the leases bucket), against
//! one lease acquire measured in the same run.
//!
//! `cargo bench -p crewlet-seats --bench seats` (release), or
//! `cargo run`-style in the dev profile with `cargo test --bench seats`.
//! `SEATS=N` changes the count (default 200).
//!
//! `IDLE=1` measures what N held seats cost while nothing happens instead
//! of the hand-over, at the node's default lease TTL and heartbeat: the
//! time to hold them all, the CPU of this process and of nats-server over
//! `IDLE_SECS` (default 30) against the same two with no seat held
//! (measured first, in the same run), and this process's RSS per seat.
//! `IDLE_FETCH=S` sets the mailboxes' sweep (`SeatsConfig::idle_fetch`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use crewlet_company::{Active, ActiveCompany, Company};
use crewlet_coord::{Bucket, Coord, CoordOptions, NodeStatus, Owner};
use crewlet_seats::{Batch, SeatHost, SeatLeases, SeatSpec, Seats, SeatsConfig, TurnVerdict};
use crewlet_testkit::NatsServer;

struct NoOp;

impl SeatHost for NoOp {
    type Equipped = ();

    async fn equip(&self, _seat: &SeatSpec, _active: &Active) -> Result<(), String> {
        Ok(())
    }

    async fn unequip(&self, _seat: &SeatSpec, _equipped: ()) {}

    async fn run(&self, _seat: &SeatSpec, _equipped: &(), _batch: Batch) -> TurnVerdict {
        TurnVerdict::Done
    }
}

fn company(n: usize) -> Company {
    let mut doc = String::from(
        "[org]\nname = \"Bench\"\n\n[roles.eng]\nsystem_prompt = \"b\"\n\
         executor = [{ provider = \"openai\", model = \"m\", credentials = \"${K}\" }]\n\
         reviewer = { provider = \"openai\", model = \"m\", credentials = \"${K}\" }\n\n[seats]\n",
    );
    for i in 0..n {
        doc.push_str(&format!("seat-{i:04} = {{ role = \"eng\" }}\n"));
    }
    Company::parse(&doc).expect("bench company")
}

fn main() {
    let n: usize = std::env::var("SEATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let server = NatsServer::start();
        let client = async_nats::connect(server.url()).await.expect("connect");
        let js = jetstream::new(client.clone());
        crewlet_stream::streams::ensure_streams(&js, 1)
            .await
            .expect("streams");
        let idle = std::env::var("IDLE").is_ok_and(|v| v == "1");
        let owner = Owner::incarnation("bench");
        let mut opts = CoordOptions::new(owner.clone());
        if !idle {
            opts.heartbeat = Duration::from_secs(15);
            opts.lease_ttl = Duration::from_secs(45);
        }
        let coord = Coord::open(client.clone(), opts).await.expect("coord");
        let company = company(n);
        let t = Instant::now();
        crewlet_stream::ensure_mailboxes(
            &js,
            &coord.records(Bucket::Mailboxes),
            company.handles().map(|h| h.as_str()),
        )
        .await
        .expect("mailboxes");
        let mailboxes = t.elapsed();
        let active = ActiveCompany::new(Some(Active::local(company)));
        let mut cfg = SeatsConfig::new(
            "bench",
            owner.clone(),
            SeatLeases::of(&coord),
            js.clone(),
            active.clone(),
            Arc::new(NoOp),
        );
        if let Some(secs) = std::env::var("IDLE_FETCH")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            cfg.idle_fetch = Duration::from_secs(secs);
        }
        // Presence: placement shares seats among the live `seats` nodes.
        coord
            .acquire_presence("bench", &owner, seats_status())
            .await
            .expect("presence")
            .yes()
            .expect("presence won");
        let span = Duration::from_secs(
            std::env::var("IDLE_SECS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(30),
        );
        let nats_pid = server.pid().expect("nats-server pid");
        let unheld = if idle {
            Some((idle::sample(nats_pid, span).await, idle::rss_kib()))
        } else {
            None
        };
        let t = Instant::now();
        let seats = Seats::start(cfg).expect("seats");
        let mut held = seats.watch_held();
        held.wait_for(|h| *h == n).await.expect("held");
        let attach = t.elapsed();
        eprintln!("{n} seats held in {attach:?}");
        if let Some((baseline, rss_before)) = unheld {
            // Let the last attaches' first pulls settle before sampling.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let renewed = coord.renewals().yes;
            let busy = idle::sample(nats_pid, span).await;
            let renewed = coord.renewals().yes - renewed;
            let rss = idle::rss_kib().saturating_sub(rss_before);
            eprintln!("sampled; stopping");
            seats.stop().await;
            idle::print(n, attach, baseline, busy, rss, coord.options().heartbeat);
            idle::print_renews(renewed, span, baseline, busy, coord.seat_beat());
            return;
        }
        let join = join(&client, &js, &coord, n).await;
        let t = Instant::now();
        seats.stop().await;
        let stop = t.elapsed();
        let profile = if cfg!(debug_assertions) {
            "dev"
        } else {
            "release"
        };
        println!("seats: {n} seats, {profile} profile, one nats-server on loopback");
        println!("  creating the mailboxes (not part of the figure): {mailboxes:?}");
        println!(
            "  acquire + equip (no-op) + attach, all {n}: {attach:?} ({:?} per seat)",
            attach / n as u32
        );
        println!("  stop (detach + unequip + release), all {n}: {stop:?}");
        join.print(n);
    });
}

fn seats_status() -> NodeStatus {
    NodeStatus {
        roles: vec!["seats".into()],
        ..NodeStatus::default()
    }
}

/// What the join phase measured.
struct Join {
    moved: usize,
    windows: Vec<Duration>,
    acquire: Duration,
    heartbeat: Duration,
    settled: Duration,
}

impl Join {
    fn print(&self, n: usize) {
        let mut w = self.windows.clone();
        w.sort();
        let at = |q: f64| {
            w.get(((w.len() as f64 * q).ceil() as usize).saturating_sub(1))
                .copied()
                .unwrap_or_default()
        };
        let (p50, p99, max) = (at(0.5), at(0.99), w.last().copied().unwrap_or_default());
        println!(
            "  a second node joins {n} seats: {} moved (in {:?}); unowned window p50 {p50:?}, p99 {p99:?}, max {max:?}",
            self.moved, self.settled
        );
        println!(
            "    baseline, one lease acquire on this server: {:?} -> p99 window / acquire = {:.1}x; heartbeat {:?} (the window before releases were announced) -> p99 / heartbeat = {:.4}x",
            self.acquire,
            p99.as_secs_f64() / self.acquire.as_secs_f64(),
            self.heartbeat,
            p99.as_secs_f64() / self.heartbeat.as_secs_f64()
        );
    }
}

/// A second node joins: the first gives back half, the second claims them.
async fn join(
    client: &async_nats::Client,
    js: &jetstream::Context,
    first: &Coord,
    n: usize,
) -> Join {
    use futures::StreamExt;
    // Every change to the leases bucket from now on, with the broker's time.
    let stream = js
        .get_stream(format!("KV_{}_leases", first.options().namespace))
        .await
        .expect("the leases stream");
    let mut watch = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            deliver_policy: jetstream::consumer::DeliverPolicy::New,
            ..Default::default()
        })
        .await
        .expect("watch the leases")
        .messages()
        .await
        .expect("watch the leases");
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    // Every change so far: a released key's delete, then its next put.
    let watcher = tokio::spawn(async move {
        let mut released: std::collections::HashMap<String, time::OffsetDateTime> =
            Default::default();
        let mut windows = Vec::new();
        while let Some(Some(next)) = tokio::select! {
            n = watch.next() => Some(n),
            _ = stop_rx.changed() => None,
        } {
            let m = match next {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("watch: {e}");
                    continue;
                }
            };
            let key = m.subject.to_string();
            if !key.contains(".seat.") || key.contains("bench-probe") {
                continue;
            }
            let at = m.info().expect("a stream message").published;
            let removed = m
                .headers
                .as_ref()
                .and_then(|h| h.get("KV-Operation"))
                .is_some();
            if removed {
                released.insert(key, at);
            } else if let Some(gone) = released.remove(&key) {
                windows.push(Duration::try_from(at - gone).unwrap_or_default());
            }
        }
        windows
    });
    let owner = Owner::incarnation("bench-b");
    let mut opts = CoordOptions::new(owner.clone());
    opts.heartbeat = first.options().heartbeat;
    opts.lease_ttl = first.options().lease_ttl;
    let coord = Coord::open(client.clone(), opts).await.expect("coord b");
    // Baseline: one acquire and release of a lease nobody holds.
    let probe = crewlet_coord::ResourceName::seat("bench-probe").expect("name");
    let t = Instant::now();
    let lease = coord
        .acquire(&probe, &owner, None)
        .await
        .expect("acquire")
        .yes()
        .expect("won");
    let acquire = t.elapsed();
    assert!(coord.release(&lease).await.expect("release").is_yes());
    coord
        .acquire_presence("bench-b", &owner, seats_status())
        .await
        .expect("presence b")
        .yes()
        .expect("presence b won");
    let active = ActiveCompany::new(Some(Active::local(company(n))));
    let cfg = SeatsConfig::new(
        "bench-b",
        owner,
        SeatLeases::of(&coord),
        js.clone(),
        active,
        Arc::new(NoOp),
    );
    let t = Instant::now();
    let b = Seats::start(cfg).expect("seats b");
    let mut held = b.watch_held();
    let share = n / 2;
    held.wait_for(|h| *h >= share)
        .await
        .expect("b holds its share");
    let settled = t.elapsed();
    // Let the watch catch up with the last claims, then stop it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _ = stop_tx.send(true);
    let windows = watcher.await.expect("the watch task");
    b.stop().await;
    Join {
        moved: windows.len(),
        windows,
        acquire,
        heartbeat: first.options().heartbeat,
        settled,
    }
}

/// The idle figures: CPU time of this process and of nats-server over a
/// span, from `/proc`.
mod idle {
    use std::time::Duration;

    /// CPU used over a span, as fractions of one core.
    #[derive(Debug, Clone, Copy)]
    pub struct Busy {
        pub node: f64,
        pub nats: f64,
    }

    fn cpu_ticks(pid: &str) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        // Fields after the command's closing parenthesis; utime and stime
        // are the 12th and 13th of those.
        let rest = &stat[stat.rfind(')').expect("comm") + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
    }

    pub async fn sample(nats_pid: u32, span: Duration) -> Busy {
        let nats = nats_pid.to_string();
        let before = (cpu_ticks("self"), cpu_ticks(&nats));
        tokio::time::sleep(span).await;
        let after = (cpu_ticks("self"), cpu_ticks(&nats));
        // Linux reports CPU time in clock ticks of 1/100 s.
        let share = |t: u64| t as f64 / 100.0 / span.as_secs_f64();
        Busy {
            node: share(after.0 - before.0),
            nats: share(after.1 - before.1),
        }
    }

    /// The seat renews in the sampled span and what each cost: the span's
    /// CPU above the no-seat baseline, divided among them.
    pub fn print_renews(renewed: u64, span: Duration, baseline: Busy, busy: Busy, beat: Duration) {
        let per_s = renewed as f64 / span.as_secs_f64();
        let above = |b: f64, base: f64| (b - base).max(0.0) * span.as_secs_f64() * 1e6;
        let each = |b: f64, base: f64| above(b, base) / renewed.max(1) as f64;
        println!(
            "  seat renews (seat beat {beat:?}): {renewed} in {span:?} ({per_s:.0}/s); CPU above baseline per renew: node {:.0} µs + nats-server {:.0} µs",
            each(busy.node, baseline.node),
            each(busy.nats, baseline.nats)
        );
    }

    pub fn rss_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .expect("VmRSS")
    }

    pub fn print(
        n: usize,
        attach: Duration,
        baseline: Busy,
        busy: Busy,
        rss_kib: u64,
        heartbeat: Duration,
    ) {
        let pct = |f: f64| f * 100.0;
        println!("idle seats: {n} held, heartbeat {heartbeat:?}, one nats-server on loopback");
        println!("  acquire + equip (no-op) + attach, all {n}: {attach:?}");
        println!(
            "  idle CPU, % of one core: node {:.2} + nats-server {:.2} = {:.2} (no seat held, same run: {:.2} + {:.2} = {:.2})",
            pct(busy.node),
            pct(busy.nats),
            pct(busy.node + busy.nats),
            pct(baseline.node),
            pct(baseline.nats),
            pct(baseline.node + baseline.nats)
        );
        println!(
            "  node RSS added by the seats: {rss_kib} KiB, {:.1} KB per seat",
            rss_kib as f64 * 1.024 / n as f64
        );
    }
}
