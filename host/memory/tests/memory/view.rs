//! The memory view (`GET /agents/{handle}/memory`'s answer) on real store
//! files and a real nats-server: a seat's rows written on another node are
//! replayed into this node's store before they are read back, and a stream
//! that cannot be read is an error, never an empty memory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crewlet_memory::{Changelog, Diary, Memory, MemoryError, ViewError, memory_tables, view};
use crewlet_store::{DiaryNote, Store};
use crewlet_testkit::NatsServer;

use crate::common::{self, store};

async fn memory(server: &NatsServer, store: &Arc<Store>) -> Memory {
    memory_tables(common::changelog(server).await, store)
}

#[tokio::test]
async fn the_view_replays_rows_another_node_wrote_and_an_unreadable_stream_is_an_error() {
    let mut server = NatsServer::start();
    let ((_a_dir, a), (_b_dir, b)) = (store(), store());
    let (log, _carrier) = Changelog::start(memory(&server, &a).await);
    let note = a
        .put_note(&DiaryNote {
            seat: "ada".into(),
            note_id: "n1".into(),
            text: "The deploy key lives in vault/ci.".into(),
            turn_id: Some("t1".into()),
            created_ms: 10,
            updated_ms: 10,
            vector: None,
            change_seq: 0,
        })
        .unwrap();
    log.offer::<Diary>(&note).unwrap();

    let on_b = memory(&server, &b).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let shown = loop {
        let shown = view(&on_b, &b, "ada", 86_400_000).await.unwrap();
        if shown["notes"].as_array().is_some_and(|n| !n.is_empty()) {
            break shown;
        }
        assert!(
            Instant::now() < deadline,
            "the note never reached the view: {shown}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(shown["handle"], "ada");
    assert_eq!(
        shown["notes"][0]["text"],
        "The deploy key lives in vault/ci."
    );
    assert_eq!(shown["notes"][0]["turn_id"], "t1");
    assert!(shown["episodes"].as_array().unwrap().is_empty());
    assert!(
        b.note("ada", "n1").unwrap().is_some(),
        "replayed into this node's store"
    );

    server.kill();
    let err = tokio::time::timeout(Duration::from_secs(60), view(&on_b, &b, "ada", 86_400_000))
        .await
        .expect("the view answers within its bounds")
        .unwrap_err();
    assert!(
        matches!(err, ViewError::Unhydrated(MemoryError::Unreadable { .. })),
        "{err:?}"
    );
}
