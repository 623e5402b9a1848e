//! The watch loop against a real nats-server: a bucket that stops answering
//! under a live watch puts it on the board as re-opening (attempts counted,
//! the error named), and once the bucket answers again the watch resumes
//! with only the difference from what it had delivered.

use std::time::{Duration, Instant};

use async_nats::jetstream;
use crewlet_testkit::NatsServer;

use super::*;
use crate::catalogue::BucketSpec;
use crate::manifest::BucketDecl;
use crate::state::KvState;

fn spec() -> BucketSpec {
    BucketSpec {
        name: "mod_watcher_notes".into(),
        owner: "watcher".into(),
        local: "notes".into(),
        decl: Some(BucketDecl {
            local: "notes".into(),
            history: 1,
            ttl: None,
        }),
    }
}

fn step(item: &WatchItem) -> String {
    let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
    match item {
        WatchItem::Current(e) => format!("current {}={}", e.key, text(&e.value)),
        WatchItem::EndOfCurrent => "end-of-current".into(),
        WatchItem::Put(e) => format!("put {}={}", e.key, text(&e.value)),
        WatchItem::Deleted(k) => format!("deleted {k}"),
    }
}

async fn next_steps(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<WatchItem>,
    n: usize,
    within: Duration,
) -> Vec<String> {
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(within, rx.recv()).await {
            Ok(Some(item)) => out.push(step(&item)),
            _ => panic!("{n} watch steps expected within {within:?}, got {out:?}"),
        }
    }
    out
}

async fn board_until(
    board: &WatchBoard,
    within: Duration,
    what: &str,
    cond: impl Fn(&WatchView) -> bool,
) -> WatchView {
    let deadline = Instant::now() + within;
    loop {
        let views = board.views();
        if let Some(v) = views.iter().find(|v| cond(v)) {
            return v.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no watch {what} within {within:?}: {views:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn backoff_doubles_from_half_a_second_to_thirty() {
    let waits: Vec<u64> = (1..=9).map(|a| backoff(a).as_millis() as u64).collect();
    assert_eq!(
        waits,
        [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
    );
    assert_eq!(backoff(u32::MAX), REOPEN_MAX);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_whose_bucket_stops_answering_is_reopened_and_resumes_after_what_it_delivered() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let state: Arc<dyn StateBackend> = Arc::new(KvState::nats(client.clone()));
    state.ensure_bucket(&spec()).await.unwrap();
    let bucket = spec().name;
    let mut old = HashMap::new();
    for (k, v) in [("a", "1"), ("b", "1"), ("c", "1")] {
        old.insert(k, state.put(&bucket, k, v.into()).await.unwrap());
    }

    let board = Arc::new(WatchBoard::default());
    let listing = Arc::new(tokio::sync::Semaphore::new(1));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let task = WatchTask {
        plugin: "watcher".into(),
        local: "notes".into(),
        bucket: bucket.clone(),
        backend: state.clone(),
        listing: listing.clone(),
        entry: board.register(7, "notes"),
    };
    let running = tokio::spawn(task.run(move |item| {
        let tx = tx.clone();
        async move { tx.send(item).is_ok() }
    }));
    assert_eq!(
        next_steps(&mut rx, 4, Duration::from_secs(10)).await,
        [
            "current a=1",
            "current b=1",
            "current c=1",
            "end-of-current"
        ]
    );
    board_until(&board, Duration::from_secs(5), "live", |v| {
        v.id == 7 && v.bucket == "notes" && v.state == WatchState::Live
    })
    .await;
    state.put(&bucket, "a", "2".into()).await.unwrap();
    assert_eq!(
        next_steps(&mut rx, 1, Duration::from_secs(10)).await,
        ["put a=2"]
    );

    // The bucket stops answering: its stream is gone.
    let js = jetstream::new(client.clone());
    js.delete_stream(format!("KV_{bucket}")).await.unwrap();
    let reopening = board_until(&board, Duration::from_secs(30), "re-opening twice", |v| {
        v.state == WatchState::Reopening && v.attempts >= 2
    })
    .await;
    assert!(
        reopening.last_error.is_some(),
        "the board names why: {reopening:?}"
    );
    assert!(
        rx.try_recv().is_err(),
        "nothing is delivered while the bucket is gone"
    );

    // It answers again, holding what changed meanwhile: b rewritten at the
    // revision the old b had (the new stream restarts its revisions), c
    // rewritten with its old value at its old revision, a gone, d new. The
    // module's listing permit is held meanwhile, so the watch re-lists
    // only the finished bucket.
    let hold = listing.clone().acquire_owned().await.unwrap();
    state.ensure_bucket(&spec()).await.unwrap();
    state.put(&bucket, "d", "1".into()).await.unwrap();
    let b = state.put(&bucket, "b", "2".into()).await.unwrap();
    let c = state.put(&bucket, "c", "1".into()).await.unwrap();
    assert_eq!((b, c), (old["b"], old["c"]), "revisions restarted");
    drop(hold);
    let mut resumed = next_steps(&mut rx, 3, Duration::from_secs(60)).await;
    resumed.sort();
    assert_eq!(resumed, ["deleted a", "put b=2", "put d=1"]);
    let live = board_until(&board, Duration::from_secs(5), "live again", |v| {
        v.state == WatchState::Live
    })
    .await;
    assert_eq!((live.reopened, live.attempts), (1, 0), "{live:?}");
    assert!(
        live.last_error.is_some(),
        "the last outage stays named: {live:?}"
    );

    // Live again: a change after the re-open is a put, once.
    state.put(&bucket, "e", "1".into()).await.unwrap();
    assert_eq!(
        next_steps(&mut rx, 1, Duration::from_secs(10)).await,
        ["put e=1"]
    );
    assert!(rx.try_recv().is_err(), "a step was delivered twice");

    // A watch ended with its instance leaves the board.
    running.abort();
    let _ = running.await;
    assert!(board.views().is_empty(), "{:?}", board.views());
}
