//! Custody on a real nats-server and real SQLite files: a batch two data
//! nodes took is kept by exactly one; a crash between write and claim
//! settles at the next pass; an unanswered claim deletes nothing; a
//! stateless node's events reach a data node's log through the stream.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use crewlet_bus::{CUSTODY_STREAM, CUSTODY_SUBJECTS};
use crewlet_coord::{Answer, Coord, CoordOptions, Owner};
use crewlet_history::custody::{self, CustodyError, Keeper, Outcome, SettleReport};
use crewlet_store::{CustodyBatch, EventQuery, EventRecord, Store};
use crewlet_testkit::NatsServer;

fn options(node: &str) -> CoordOptions {
    CoordOptions::new(Owner::incarnation(node))
}

/// A data node: its own log, and coordination on its own connection.
struct DataNode {
    _dir: tempfile::TempDir,
    store: Arc<Store>,
    keeper: Keeper,
}

async fn data_node(server: &NatsServer, id: &str) -> DataNode {
    let client = async_nats::connect(server.url()).await.unwrap();
    let coord = Coord::open(client, options(id)).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open_in(dir.path()).unwrap());
    let keeper = Keeper::new(id.into(), store.clone(), coord.custody());
    DataNode {
        _dir: dir,
        store,
        keeper,
    }
}

fn batch(id: &str, n: usize) -> CustodyBatch {
    CustodyBatch {
        batch: id.into(),
        origin: "edge".into(),
        events: (0..n)
            .map(|i| {
                EventRecord::new(
                    format!("{id}-{i}"),
                    "turn_started",
                    "edge",
                    serde_json::json!({ "turn_id": format!("t{i}") }),
                )
            })
            .collect(),
    }
}

fn rows(store: &Store) -> usize {
    store
        .events(&EventQuery {
            limit: 1_000,
            ..EventQuery::default()
        })
        .unwrap()
        .len()
}

#[tokio::test]
async fn a_batch_taken_by_two_data_nodes_is_kept_by_exactly_one() {
    let server = NatsServer::start();
    let a = data_node(&server, "data-a").await;
    let b = data_node(&server, "data-b").await;
    for round in 0..10 {
        let one = batch(&format!("race-{round}"), 5);
        let (ta, tb) = tokio::join!(a.keeper.take(&one), b.keeper.take(&one));
        let (ta, tb) = (ta.unwrap(), tb.unwrap());
        let kept: Vec<&str> = [(&ta, "data-a"), (&tb, "data-b")]
            .iter()
            .filter(|(t, _)| **t == Outcome::Kept)
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(kept.len(), 1, "round {round}: {ta:?} / {tb:?}");
        let loser = if kept[0] == "data-a" { &tb } else { &ta };
        assert_eq!(
            loser,
            &Outcome::Dropped {
                keeper: kept[0].to_owned(),
                rows: 5
            }
        );
        let (ra, rb) = (
            a.store.custody_rows(&one.batch).unwrap(),
            b.store.custody_rows(&one.batch).unwrap(),
        );
        assert_eq!((ra + rb, ra * rb), (5, 0), "round {round}: {ra} + {rb}");
    }
    assert_eq!(rows(&a.store) + rows(&b.store), 50);
    assert!(a.store.unsettled_custody().unwrap().is_empty());
    assert!(b.store.unsettled_custody().unwrap().is_empty());
}

#[tokio::test]
async fn a_crash_between_write_and_claim_settles_at_the_next_pass() {
    let server = NatsServer::start();
    let a = data_node(&server, "data-a").await;
    let b = data_node(&server, "data-b").await;
    // Node a wrote two batches and died before claiming either; node b
    // took the first one meanwhile (the stream handed it on).
    let (lost, orphan) = (batch("lost", 3), batch("orphan", 2));
    a.store.write_custody_batch(&lost).unwrap();
    a.store.write_custody_batch(&orphan).unwrap();
    assert_eq!(b.keeper.take(&lost).await.unwrap(), Outcome::Kept);

    // Its next pass: the batch b keeps goes, the one nobody claimed is
    // claimed and stays.
    let report = a.keeper.settle_pass().await;
    assert_eq!(
        report,
        SettleReport {
            kept: 1,
            dropped: 1,
            unknown: 0
        }
    );
    assert_eq!(a.store.custody_rows("lost").unwrap(), 0);
    assert_eq!(a.store.custody_rows("orphan").unwrap(), 2);
    assert_eq!(b.store.custody_rows("lost").unwrap(), 3);
    assert!(a.store.unsettled_custody().unwrap().is_empty());
    // And the bucket says so to anyone who took the orphan later.
    assert_eq!(
        b.keeper.take(&orphan).await.unwrap(),
        Outcome::Dropped {
            keeper: "data-a".into(),
            rows: 2
        }
    );
    // A pass with nothing unsettled does nothing.
    assert_eq!(a.keeper.settle_pass().await, SettleReport::default());
}

#[tokio::test]
async fn a_claim_the_store_did_not_answer_deletes_nothing() {
    let (faulty, coord) = Coord::breakable_memory(options("data-a"));
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open_in(dir.path()).unwrap());
    let keeper = Keeper::new("data-a".into(), store.clone(), coord.custody());
    faulty.break_store();
    let one = batch("dark", 4);
    let err = keeper.take(&one).await.unwrap_err();
    assert!(matches!(err, CustodyError::Unknown { .. }), "{err}");
    assert!(err.to_string().contains("next settle pass"), "{err}");
    assert_eq!(store.custody_rows("dark").unwrap(), 4, "kept, not dropped");
    assert_eq!(keeper.settle_pass().await.unknown, 1);
    assert_eq!(store.custody_rows("dark").unwrap(), 4);

    faulty.heal();
    assert_eq!(keeper.settle_pass().await.kept, 1);
    assert!(store.unsettled_custody().unwrap().is_empty());
    assert_eq!(
        coord.custody().claim("dark", "data-b").await.unwrap(),
        Answer::No("data-a".into())
    );
}

#[tokio::test]
async fn a_stateless_nodes_events_reach_a_data_nodes_log_through_the_stream() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = jetstream::new(client);
    js.create_stream(stream::Config {
        name: CUSTODY_STREAM.into(),
        subjects: vec![CUSTODY_SUBJECTS.into()],
        retention: stream::RetentionPolicy::Interest,
        ..Default::default()
    })
    .await
    .unwrap();
    js.create_stream(stream::Config {
        name: crewlet_bus::EVENTS_STREAM.into(),
        subjects: vec![crewlet_bus::EVENTS_SUBJECTS.into()],
        ..Default::default()
    })
    .await
    .unwrap();
    // Every node makes the durable before it publishes: the stream keeps
    // nothing no durable covers.
    custody::ensure_durable(&js).await.unwrap();
    // The stream's reach probe (every node's start sends one) is no batch:
    // the durable does not cover it, so the stream keeps none.
    js.publish("crewlet.custody._reach", "probe".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let edge = crewlet_observe::Publisher::stateless("edge", js.clone());
    let published = futures::future::join_all(
        (0..40).map(|i| edge.publish(edge.event("tool_call", serde_json::json!({ "i": i })))),
    )
    .await;
    for p in &published {
        let p = p.as_ref().unwrap();
        assert_eq!((p.seq, p.node_id.as_str()), (0, "edge"), "no local row");
    }

    let data = data_node(&server, "data-a").await;
    let running = custody::start(data.keeper.clone(), js.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while rows(&data.store) < 40 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of 40 rows kept",
            rows(&data.store)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.stop().await;
    let kept = data
        .store
        .events(&EventQuery {
            limit: 1_000,
            ..EventQuery::default()
        })
        .unwrap();
    assert!(kept.iter().all(|e| e.node_id == "edge"));
    assert_eq!(
        data.keeper.stats().view()["batches_kept"]
            .as_u64()
            .unwrap()
            .min(1),
        1
    );
    // The stream forgot what a log holds (interest retention, all acked).
    let mut s = js.get_stream(CUSTODY_STREAM).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while s.info().await.unwrap().state.messages > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "batches left on the stream"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
