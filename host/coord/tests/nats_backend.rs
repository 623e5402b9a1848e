//! Cases only the real store has: bucket adoption, the replica refusal,
//! local lease mode, and the naive listing that the certified one replaces.

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use crewlet_coord::{Coord, CoordKind, CoordOptions, OpenError, Owner, ResourceName};
use crewlet_testkit::NatsServer;
use futures::TryStreamExt;

fn opts(namespace: &str) -> CoordOptions {
    let mut o = CoordOptions::new(Owner::incarnation("backend"));
    o.namespace = namespace.to_owned();
    o.request_timeout = Duration::from_secs(2);
    o
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An existing bucket is adopted, never rewritten; a differing lease TTL is
/// logged (naming the value in force) and honoured.
#[tokio::test]
async fn existing_buckets_are_adopted_and_a_differing_lease_ttl_is_honoured() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let mut first = opts("adopt");
    first.lease_ttl = Duration::from_secs(5);
    Coord::open(client.clone(), first).await.unwrap();

    let log = Captured::default();
    let sink = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let mut second = opts("adopt");
    second.lease_ttl = Duration::from_secs(9);
    let c = Coord::open(client.clone(), second).await.unwrap();
    assert_eq!(
        c.lease_ttl(),
        Duration::from_secs(5),
        "the TTL in force is the bucket's"
    );
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("coord_kv_lease_ttl_differs"), "{text}");
    assert!(
        text.contains("5s"),
        "the log names the value in force: {text}"
    );
    let info = jetstream::new(client)
        .get_stream("KV_adopt_leases")
        .await
        .unwrap()
        .get_info()
        .await
        .unwrap();
    assert_eq!(
        info.config.max_age,
        Duration::from_secs(5),
        "opening rewrote the bucket"
    );
    // Acquires run at the TTL in force.
    let l = c
        .acquire(
            &ResourceName::seat("x").unwrap(),
            &Owner::incarnation("n"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(l.yes().unwrap().ttl, Duration::from_secs(5));
}

/// A bucket with fewer replicas than configured refuses the start, naming both counts.
#[tokio::test]
async fn fewer_replicas_than_configured_refuses_to_start() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    Coord::open(client.clone(), opts("reps")).await.unwrap();
    let mut wants_three = opts("reps");
    wants_three.replicas = 3;
    match Coord::open(client, wants_three).await {
        Err(
            e @ OpenError::TooFewReplicas {
                has: 1, want: 3, ..
            },
        ) => {
            let msg = e.to_string();
            assert!(
                msg.contains("1 replica") && msg.contains("configured for 3"),
                "{msg}"
            );
        }
        Err(e) => panic!("wrong refusal: {e}"),
        Ok(_) => panic!("started on fewer replicas than configured"),
    }
}

/// `local` keeps leases in process; every record still lives in the KV.
#[tokio::test]
async fn local_kind_keeps_leases_in_process_and_records_in_the_kv() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let mut o = opts("loc");
    o.kind = CoordKind::Local;
    let c = Coord::open(client.clone(), o).await.unwrap();
    let seat = ResourceName::seat("a").unwrap();
    assert_eq!(
        c.acquire(&seat, &Owner::incarnation("n"), None)
            .await
            .unwrap()
            .yes()
            .unwrap()
            .epoch,
        1
    );
    c.complete("t1").await.unwrap();
    let js = jetstream::new(client);
    assert!(
        js.get_stream("KV_loc_leases").await.is_err(),
        "local mode created a leases bucket"
    );
    assert!(js.get_stream("KV_loc_ledger").await.is_ok());
}

/// The companion case: the naive listing (`keys()`, an ordered pass ended
/// by the client's pending-count guess) does miss live keys under renewal
/// churn — which is what the certified listing exists for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn naive_keys_listing_misses_live_keys_under_churn() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = jetstream::new(client);
    let kv = js
        .create_key_value(jetstream::kv::Config {
            bucket: "naive".into(),
            history: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    let keys: BTreeSet<String> = (0..5).map(|i| format!("node.n{i}")).collect();
    for k in &keys {
        kv.put(k, "x".into()).await.unwrap();
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let renewers: Vec<_> = (0..3)
        .map(|i| {
            let (kv, stop) = (kv.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    kv.put(format!("node.n{i}"), "x".into()).await.unwrap();
                }
            })
        })
        .collect();
    let mut listings = 0;
    let mut missed = 0;
    while listings < 3000 && missed == 0 {
        let got: BTreeSet<String> = kv.keys().await.unwrap().try_collect().await.unwrap();
        listings += 1;
        if got != keys {
            missed += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for r in renewers {
        r.await.unwrap();
    }
    assert!(
        missed > 0,
        "the naive listing never missed in {listings} listings"
    );
    eprintln!("naive keys() missed a live key after {listings} listings");
}
