//! How long one node takes to acquire, equip (a host that does nothing) and
//! attach N seats on a real nats-server, and to give them all back.
//!
//! `cargo bench -p crewlet-seats --bench seats` (release), or
//! `cargo run`-style in the dev profile with `cargo test --bench seats`.
//! `SEATS=N` changes the count (default 200).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use crewlet_company::{Active, ActiveCompany, Company};
use crewlet_coord::{Coord, CoordOptions, Owner};
use crewlet_seats::{Batch, SeatHost, SeatSpec, Seats, SeatsConfig, TurnVerdict};
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
        let owner = Owner::incarnation("bench");
        let mut opts = CoordOptions::new(owner.clone());
        opts.heartbeat = Duration::from_secs(15);
        opts.lease_ttl = Duration::from_secs(45);
        let coord = Coord::open(client.clone(), opts).await.expect("coord");
        let company = company(n);
        let t = Instant::now();
        crewlet_stream::ensure_mailboxes(&js, &coord, company.handles().map(|h| h.as_str()))
            .await
            .expect("mailboxes");
        let mailboxes = t.elapsed();
        let active = ActiveCompany::new(Some(Active::local(company)));
        let cfg = SeatsConfig::new("bench", owner, coord, js, active, Arc::new(NoOp));
        let t = Instant::now();
        let seats = Seats::start(cfg).expect("seats");
        let mut held = seats.watch_held();
        held.wait_for(|h| *h == n).await.expect("held");
        let attach = t.elapsed();
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
    });
}
