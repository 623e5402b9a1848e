//! How long a node takes to hydrate a seat with N session rows before its
//! mailbox is attached (`Memory::hydrate`: the ordered pass over
//! `crewlet.memory.HANDLE.>`, the leader's newest-row check, every row
//! decoded and written to a fresh SQLite store), against a raw read of the
//! same rows in the same run (the same ordered consumer, payloads only:
//! no decode, no store), on a real nats-server. A second seat with as many
//! rows sits beside it in the stream, so the filter does real work.
//!
//! `cargo bench -p crewlet-memory --bench hydrate`; `ROWS=N` (default
//! 10,000), `RUNS=N` (default 5; each run times both, raw first).

mod common;

use std::sync::Arc;
use std::time::Instant;

use async_nats::jetstream::{self, consumer};
use common::{env, pct};
use crewlet_bus::{MEMORY_STREAM, memory_filter};
use crewlet_memory::{Memory, Sessions};
use crewlet_store::{Said, SessionRow, Store};
use crewlet_testkit::NatsServer;
use futures::StreamExt;

/// A session as a busy thread leaves it: two turns, two replies.
fn row(seat: &str, i: usize) -> SessionRow {
    let said = |n: usize| Said {
        turn_id: format!("019a-{i:06}-{n}"),
        text: format!(
            "Reply {n} in thread {i}: the build is green, the deploy went out at 14:02 and the on-call was told."
        ),
        at_ms: 1_765_000_000_000 + i as i64,
    };
    SessionRow {
        seat: seat.into(),
        conversation: format!("C0{:04}#{i}.{i}", i % 97),
        created_ms: 1_765_000_000_000 + i as i64,
        updated_ms: 1_765_000_000_100 + i as i64,
        turns: 2,
        said: vec![said(1), said(2)],
    }
}

/// The raw read: every row of `seat`, payload bytes only.
async fn raw_read(js: &jetstream::Context, seat: &str) -> (usize, usize) {
    let stream = js.get_stream(MEMORY_STREAM).await.unwrap();
    let c = stream
        .create_consumer(consumer::push::OrderedConfig {
            deliver_subject: js.client().new_inbox(),
            filter_subject: memory_filter(seat),
            deliver_policy: consumer::DeliverPolicy::LastPerSubject,
            replay_policy: consumer::ReplayPolicy::Instant,
            ..Default::default()
        })
        .await
        .unwrap();
    let name = c.cached_info().name.clone();
    let mut pending = c.cached_info().num_pending;
    let (mut rows, mut bytes) = (0, 0);
    let mut msgs = c.messages().await.unwrap();
    while pending > 0 {
        let m = msgs.next().await.unwrap().unwrap();
        pending = m.info().unwrap().pending;
        rows += 1;
        bytes += m.payload.len();
    }
    let _ = stream.delete_consumer(&name).await;
    (rows, bytes)
}

fn main() {
    let rows = env("ROWS", 10_000);
    let runs = env("RUNS", 5);
    let server = NatsServer::start();
    common::runtime().block_on(async {
        let js = common::stream(&server).await;
        let seed_dir = tempfile::tempdir().unwrap();
        let seed = Arc::new(Store::open_in(seed_dir.path()).unwrap());
        let writer = Memory::open(js.clone())
            .await
            .unwrap()
            .with(Sessions(seed));
        let t = Instant::now();
        for seat in ["ada", "bob"] {
            common::seed::<Sessions>(&js, &writer, (0..rows).map(|i| row(seat, i))).await;
        }
        eprintln!(
            "seeded {} rows for each of ada and bob in {:?}",
            rows,
            t.elapsed()
        );

        let (mut raw, mut hydrate, mut again) = (Vec::new(), Vec::new(), Vec::new());
        let mut size = 0;
        for _ in 0..runs {
            let t = Instant::now();
            let (n, bytes) = raw_read(&js, "ada").await;
            raw.push(t.elapsed());
            assert_eq!(n, rows);
            size = bytes;

            let dir = tempfile::tempdir().unwrap();
            let store = Arc::new(Store::open_in(dir.path()).unwrap());
            let memory = Memory::open(js.clone())
                .await
                .unwrap()
                .with(Sessions(store.clone()));
            let t = Instant::now();
            let done = memory.hydrate("ada").await.unwrap();
            hydrate.push(t.elapsed());
            assert_eq!((done.rows, done.written), (rows as u64, rows as u64));
            assert_eq!(store.session_count("ada").unwrap(), rows as u64);
            assert_eq!(store.session_count("bob").unwrap(), 0);

            // The same seat again on the same node: every row already here.
            let t = Instant::now();
            memory.hydrate("ada").await.unwrap();
            again.push(t.elapsed());
        }
        let (r, h, a) = (
            pct(&mut raw, 0.5),
            pct(&mut hydrate, 0.5),
            pct(&mut again, 0.5),
        );
        println!(
            "hydrate {rows} session rows ({} KiB) of one seat, {runs} runs, p50 (min .. max):",
            size / 1024
        );
        println!(
            "  raw stream read (ordered consumer, bytes only)  {r:>10.1?} ({:.1?} .. {:.1?})",
            raw[0],
            raw[raw.len() - 1]
        );
        println!(
            "  hydrate into a fresh store                      {h:>10.1?} ({:.1?} .. {:.1?})  {:.1}x the raw read",
            hydrate[0],
            hydrate[hydrate.len() - 1],
            h.as_secs_f64() / r.as_secs_f64()
        );
        println!(
            "  hydrate again (rows already there)              {a:>10.1?} ({:.1?} .. {:.1?})",
            again[0],
            again[again.len() - 1]
        );
    });
}
