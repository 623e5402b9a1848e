//! The usage publisher and the applier, wired as a node starts them: a
//! data node counts what its log held before the start and what its
//! publisher keeps after, a stateless peer's usage lands in the data
//! node's estate too, and the peer itself answers that it holds none.

use crate::fixture::{Node, model_call};
use crewlet_estate::{UsageAsk, UsageRefusal};
use crewlet_testkit::NatsServer;

#[tokio::test]
async fn each_nodes_usage_is_published_and_applied_into_the_data_nodes_estate() {
    let server = NatsServer::start();
    let (dir1, dir2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let keeper = Node::open("n1", &server.url(), dir1.path(), true).await;
    let stateless = Node::open("n2", &server.url(), dir2.path(), false).await;

    // The keeper's publisher: one call in its log before the start (the
    // resume counts it), one kept after (the tap brings it).
    let (tap, events) = crewlet_estate::tap();
    let js = async_nats::jetstream::new(keeper.client.clone());
    let publisher = crewlet_observe::Publisher::new("n1", keeper.store.clone(), js).with_tap(tap);
    publisher
        .record(model_call("n1", "before", 5))
        .await
        .unwrap();
    let running = keeper.start(events).await;
    publisher
        .record(model_call("n1", "after", 7))
        .await
        .unwrap();

    // The stateless node's events arrive as its publisher would tap them.
    let (to, events) = tokio::sync::mpsc::unbounded_channel();
    let peer = stateless.start(events).await;
    to.send(model_call("n2", "one", 3)).unwrap();

    let row = keeper.until_usage("node", "n1", 12).await;
    assert_eq!(row["calls"], 2, "{row}");
    let row = keeper.until_usage("node", "n2", 3).await;
    assert_eq!(row["calls"], 1, "{row}");
    let health = keeper.slot.health();
    assert_eq!(health["domains"][0]["domain"], "usage", "{health}");

    assert!(stateless.slot.health().is_null());
    let refused = crewlet_estate::usage(&stateless.slot, UsageAsk::default());
    assert!(
        matches!(&refused, Err(UsageRefusal::NotHeld(why)) if why.contains("`data`")),
        "{refused:?}"
    );
    let bad = crewlet_estate::usage(
        &keeper.slot,
        UsageAsk {
            by: Some("colour".into()),
            ..UsageAsk::default()
        },
    );
    assert!(matches!(bad, Err(UsageRefusal::BadQuery(_))), "{bad:?}");

    peer.stop().await;
    running.stop().await;
}
