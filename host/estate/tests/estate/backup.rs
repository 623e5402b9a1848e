//! A backup and its restore through the estate's own entry points: the
//! artefact written on one broker (estate copy, streams, store), refused
//! into a data dir in use or from a path that holds none, prepared into an
//! empty dir and adopted by a node on a fresh broker, whose estate then
//! answers the usage the first one held; an adoption that fails keeps its
//! marker, so starting again retries.

use crate::fixture::{Node, model_call};
use crewlet_estate::backup::{PENDING, RestoreError, adopt_pending, back_up, prepare};
use crewlet_testkit::NatsServer;

#[tokio::test]
async fn a_backup_is_prepared_into_an_empty_dir_and_adopted_on_a_fresh_broker() {
    let first = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let node = Node::open("n1", &first.url(), dir.path(), true).await;
    let (to, events) = tokio::sync::mpsc::unbounded_channel();
    let running = node.start(events).await;
    to.send(model_call("n1", "one", 9)).unwrap();
    node.until_usage("node", "n1", 9).await;

    let place = tempfile::tempdir().unwrap();
    let artefact = place.path().join("artefact");
    let manifest = back_up(&node.backup_parts(), &artefact).await.unwrap();
    let files: Vec<&str> = manifest.files.iter().map(|f| f.file.as_str()).collect();
    assert!(
        files.contains(&"replicated.sqlite3") && files.contains(&"node.sqlite3"),
        "{files:?}"
    );
    assert!(
        manifest.estate.is_some() && manifest.no_estate.is_none(),
        "{manifest:?}"
    );
    running.stop().await;

    // Refused, writing nothing: a data dir in use, a path with no artefact.
    let refused = prepare(&artefact, dir.path());
    assert!(
        matches!(&refused, Err(RestoreError::NotEmpty(d)) if d == dir.path()),
        "{refused:?}"
    );
    let empty = tempfile::tempdir().unwrap();
    let missing = prepare(&place.path().join("none"), empty.path());
    assert!(
        matches!(missing, Err(RestoreError::Artefact(_))),
        "{missing:?}"
    );
    assert!(!empty.path().join(PENDING).exists());

    let fresh = tempfile::tempdir().unwrap();
    let said = prepare(&artefact, fresh.path()).unwrap();
    assert!(said.contains("restore prepared"), "{said}");
    assert!(fresh.path().join(PENDING).exists());
    assert!(fresh.path().join(crewlet_store::FILE_NAME).exists());

    let second = NatsServer::start();
    let restored = Node::open("n1", &second.url(), fresh.path(), true).await;
    adopt_pending(&restored.backup_parts()).await.unwrap();
    assert!(
        !fresh.path().join(PENDING).exists(),
        "the marker is removed"
    );
    assert!(
        fresh.path().join(crewlet_statelog::ESTATE_FILE).exists(),
        "the estate's copy is installed"
    );
    let (_to, events) = tokio::sync::mpsc::unbounded_channel();
    let running = restored.start(events).await;
    let row = restored.until_usage("node", "n1", 9).await;
    assert_eq!(row["calls"], 1, "{row}");
    running.stop().await;

    // A marker whose artefact is gone: the start stops, the marker stays.
    let broken = tempfile::tempdir().unwrap();
    std::fs::write(
        broken.path().join(PENDING),
        place.path().join("gone").display().to_string(),
    )
    .unwrap();
    let other = Node::open("n3", &second.url(), broken.path(), true).await;
    let failed = adopt_pending(&other.backup_parts()).await;
    assert!(
        matches!(&failed, Err(RestoreError::Adopt { artefact, .. }) if artefact.ends_with("gone")),
        "{failed:?}"
    );
    assert!(broken.path().join(PENDING).exists(), "kept for a retry");
}
