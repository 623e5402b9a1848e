//! Snapshots and the trim against a real nats-server: a snapshot that fails
//! its checksum is refused and the estate stays as it was; a node whose
//! position is below the trim adopts a peer's snapshot over the broker and
//! replays from it; an evicted node stops holding the trim.

use crate::common;

use common::{Node, book, js, serve, tokens, until};
use crewlet_statelog::snapshot::{self, Adopter, SnapshotError};
use crewlet_statelog::usage::Usage;
use crewlet_statelog::{DomainState, Eviction, append, trim};
use crewlet_testkit::NatsServer;
use sha2::{Digest, Sha256};

fn sha(path: &std::path::Path) -> String {
    Sha256::digest(std::fs::read(path).unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn a_snapshot_that_fails_its_checksum_is_refused_and_nothing_changes() {
    let server = NatsServer::start();
    let (_c, js) = js(&server.url()).await;
    let donor = Node::new();
    let applier = donor.applier(&js, "n1", None, None);
    let o = tokens("n1", "ada", 11);
    let p = append(&js, &o.subject(), &o.record()).await.unwrap();
    until(&applier, "applied", |s| s.position >= p).await;
    applier.stop().await;

    let file = donor.path().join("snap.sqlite3");
    let positions = donor.estate.snapshot_to(&file).unwrap();
    assert_eq!(positions.of("usage"), p);
    let want = sha(&file);
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap();

    let asker = Node::new();
    let err = snapshot::install(&asker.estate, &asker.local, &file, "n1", &want).unwrap_err();
    assert!(matches!(err, SnapshotError::Checksum { .. }), "{err}");
    assert_eq!(asker.estate.cursor("usage").unwrap().position, 0);
    assert_eq!(asker.count("SELECT COUNT(*) FROM usage_tokens"), 0);
    let adoptions = asker.local.adoptions().unwrap();
    assert_eq!(adoptions.len(), 1);
    assert!(adoptions[0].1.contains("SHA-256"), "{adoptions:?}");

    // The same file whole is installed.
    let file = donor.path().join("snap2.sqlite3");
    donor.estate.snapshot_to(&file).unwrap();
    let good = sha(&file);
    let installed = snapshot::install(&asker.estate, &asker.local, &file, "n1", &good).unwrap();
    assert_eq!(installed.of("usage"), p);
    assert_eq!(asker.input_tokens("n1", "ada"), Some(11));
}

#[tokio::test]
async fn a_node_below_the_trim_adopts_a_peers_snapshot_and_replays_from_it() {
    let server = NatsServer::start();
    let (client, js) = js(&server.url()).await;
    let book = book(&client, "n1").await;
    let a = Node::new();
    let donor = a.applier(&js, "n1", Some(book.clone()), None);
    let serving = serve(&client, &js, &a, "n1", Some(book.clone()), &donor).await;
    let mut last = 0;
    for i in 0..50 {
        let o = tokens("n1", &format!("s{i}"), i);
        last = append(&js, &o.subject(), &o.record()).await.unwrap();
    }
    until(&donor, "donor applied", |s| s.position >= last).await;
    // Wait until the donor's position is published, then trim to it.
    let trimmed = loop {
        if book.positions("usage").await.unwrap().get("n1") == Some(&last) {
            break trim::trim(&js, &book, &Usage, "n1").await.unwrap().unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(trimmed.floor, last);
    assert_eq!(trimmed.purged, 50);

    let b = Node::new();
    let adopter = Adopter {
        client: client.clone(),
        js: js.clone(),
        book: book.clone(),
        node: "n2".into(),
        staging: b.path().to_path_buf(),
    };
    let joiner = b.applier(&js, "n2", Some(book.clone()), Some(adopter));
    until(&joiner, "adopted", |s| {
        s.position >= last && s.state == DomainState::Applying
    })
    .await;
    assert_eq!(b.count("SELECT COUNT(*) FROM usage_tokens"), 50);
    assert_eq!(
        b.local.adoptions().unwrap(),
        vec![("n1".to_owned(), "installed".to_owned())]
    );
    // And replays what came after the snapshot.
    let o = tokens("n1", "late", 5);
    let p = append(&js, &o.subject(), &o.record()).await.unwrap();
    until(&joiner, "replayed", |s| s.position >= p).await;
    assert_eq!(b.input_tokens("n1", "late"), Some(5));
    serving.abort();
    donor.stop().await;
    joiner.stop().await;
}

#[tokio::test]
async fn the_trim_waits_for_the_lowest_node_and_pin_until_an_operator_evicts() {
    let server = NatsServer::start();
    let (client, js) = js(&server.url()).await;
    let book = book(&client, "n1").await;
    let mut last = 0;
    for i in 0..10 {
        let o = tokens("n1", &format!("s{i}"), i);
        last = append(&js, &o.subject(), &o.record()).await.unwrap();
    }
    book.publish("usage", "n1", last).await.unwrap();
    book.publish("usage", "gone", 3).await.unwrap();
    book.pin("usage", "backup-1", 5).await.unwrap();
    let t = trim::trim(&js, &book, &Usage, "n1").await.unwrap().unwrap();
    assert_eq!(t.floor, 3, "a node that is down still holds the trim");
    book.evict(&Eviction {
        node: "gone".into(),
        by: "ops".into(),
        reason: "disk lost".into(),
        at_ms: 1,
    })
    .await
    .unwrap();
    let t = trim::trim(&js, &book, &Usage, "n1").await.unwrap().unwrap();
    assert_eq!(t.floor, 5, "the pin holds once the node is evicted");
    book.unpin("usage", "backup-1").await.unwrap();
    let t = trim::trim(&js, &book, &Usage, "n1").await.unwrap().unwrap();
    assert_eq!(t.floor, last);
    assert_eq!(book.floor("usage").await.unwrap(), last);
    assert!(
        trim::trim(&js, &book, &Usage, "n1")
            .await
            .unwrap()
            .is_none(),
        "nothing new to trim"
    );
}
