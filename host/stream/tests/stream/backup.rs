//! Backup and restore on real nats-servers: a company's buckets (a sealed
//! secret, a budget, a module bucket, a deleted key) and streams (memory,
//! dead letters) dumped from one broker and restored onto a fresh one; an
//! altered artefact and one of a newer format refused before anything is
//! written.

use std::collections::BTreeMap;

use async_nats::jetstream::{self, kv};
use crewlet_coord::{Coord, CoordOptions, Owner};
use crewlet_stream::backup::{self, BackupError, MANIFEST, Writer};
use crewlet_testkit::NatsServer;
use futures::StreamExt;

/// A fresh fleet's broker: every stream and coordination bucket made, as
/// a started node makes them, plus one module bucket.
async fn fresh(server: &NatsServer) -> jetstream::Context {
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = jetstream::new(client.clone());
    crewlet_stream::streams::ensure_streams(&js, 1)
        .await
        .unwrap();
    Coord::open(client, CoordOptions::new(Owner::incarnation("n1")))
        .await
        .unwrap();
    js.create_key_value(kv::Config {
        bucket: "mod_notebook_pages".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    js
}

async fn entries(js: &jetstream::Context, bucket: &str) -> BTreeMap<String, Vec<u8>> {
    let store = js.get_key_value(bucket).await.unwrap();
    let mut keys = store.keys().await.unwrap();
    let mut out = BTreeMap::new();
    while let Some(k) = keys.next().await {
        let k = k.unwrap();
        if let Some(v) = store.get(&k).await.unwrap() {
            out.insert(k, v.to_vec());
        }
    }
    out
}

async fn stream_len(js: &jetstream::Context, stream: &str) -> u64 {
    js.get_stream(stream)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .messages
}

#[tokio::test]
async fn a_company_is_backed_up_and_restored_onto_a_fresh_broker() {
    let a = NatsServer::start();
    let js = fresh(&a).await;
    let secrets = js.get_key_value("crewlet_secrets").await.unwrap();
    secrets
        .put(
            "MODEL_KEY",
            b"{\"sealed\":\"xchacha:k1:abc\"}".to_vec().into(),
        )
        .await
        .unwrap();
    secrets.put("GONE", b"old".to_vec().into()).await.unwrap();
    secrets.delete("GONE").await.unwrap();
    let budgets = js.get_key_value("crewlet_budgets").await.unwrap();
    budgets
        .put("seat.ada", b"{\"spent\":42}".to_vec().into())
        .await
        .unwrap();
    let pages = js.get_key_value("mod_notebook_pages").await.unwrap();
    pages.put("home", b"hello".to_vec().into()).await.unwrap();
    for (subject, body) in [
        ("crewlet.memory.ada.sessions.d1", "row 1"),
        ("crewlet.memory.ada.sessions.d2", "row 2"),
        ("dlq.notify-inbound", "a dead letter"),
    ] {
        js.publish(subject, body.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("backup-1");
    let mut w = Writer::create(&art, "n1").unwrap();
    backup::write_streams(&js, &mut w, "crewlet").await.unwrap();
    w.add("node.sqlite3", b"the node's own store", None)
        .unwrap();
    let manifest = w.finish().unwrap();
    assert_eq!(manifest.format, backup::FORMAT_VERSION);
    let streams: Vec<&str> = manifest
        .files
        .iter()
        .filter_map(|f| f.stream.as_deref())
        .collect();
    for s in [
        "KV_crewlet_secrets",
        "KV_crewlet_budgets",
        "KV_mod_notebook_pages",
        "CREWLET_MEMORY",
        "CREWLET_DLQ",
    ] {
        assert!(streams.contains(&s), "{s} in {streams:?}");
    }
    assert!(
        !streams.contains(&"KV_crewlet_leases"),
        "who runs what is not state"
    );
    // A second backup never overwrites the first.
    assert!(matches!(
        Writer::create(&art, "n1"),
        Err(BackupError::Write { .. })
    ));

    // The broker's data is gone: a fresh one, started as a fleet starts.
    let b = NatsServer::start();
    let fresh_js = fresh(&b).await;
    let restored = backup::restore_streams(&fresh_js, &art).await.unwrap();
    assert_eq!(restored["CREWLET_MEMORY"], 2);
    assert_eq!(
        entries(&fresh_js, "crewlet_secrets").await,
        entries(&js, "crewlet_secrets").await
    );
    assert!(
        !entries(&fresh_js, "crewlet_secrets")
            .await
            .contains_key("GONE")
    );
    assert_eq!(
        entries(&fresh_js, "crewlet_budgets").await["seat.ada"],
        b"{\"spent\":42}"
    );
    assert_eq!(
        entries(&fresh_js, "mod_notebook_pages").await["home"],
        b"hello"
    );
    assert_eq!(stream_len(&fresh_js, "CREWLET_DLQ").await, 1);
}

#[tokio::test]
async fn an_altered_or_newer_artefact_is_refused_before_anything_is_written() {
    let a = NatsServer::start();
    let js = fresh(&a).await;
    js.publish("crewlet.memory.ada.sessions.d1", "row".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("b");
    let mut w = Writer::create(&art, "n1").unwrap();
    backup::write_streams(&js, &mut w, "crewlet").await.unwrap();
    w.finish().unwrap();

    let b = NatsServer::start();
    let target = fresh(&b).await;
    // One byte changed in the memory dump.
    let file = art.join("streams/CREWLET_MEMORY.jsonl");
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    std::fs::write(&file, &bytes).unwrap();
    let err = backup::restore_streams(&target, &art).await.unwrap_err();
    assert!(
        matches!(&err, BackupError::Tampered { file } if file == "streams/CREWLET_MEMORY.jsonl"),
        "{err}"
    );
    assert!(err.to_string().contains("nothing was restored"), "{err}");
    assert_eq!(stream_len(&target, "CREWLET_MEMORY").await, 0);
    bytes[at] ^= 1;
    std::fs::write(&file, &bytes).unwrap();

    // A format newer than this build's.
    let manifest = art.join(MANIFEST);
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    m["format"] = serde_json::json!(backup::FORMAT_VERSION + 1);
    m["files"] = serde_json::json!("a shape this build does not know");
    std::fs::write(&manifest, serde_json::to_vec(&m).unwrap()).unwrap();
    let err = backup::restore_streams(&target, &art).await.unwrap_err();
    assert!(
        matches!(err, BackupError::NewerFormat { found, supported }
            if found == supported + 1),
        "{err}"
    );
    assert_eq!(stream_len(&target, "CREWLET_MEMORY").await, 0);

    // Not an artefact at all.
    let err = backup::restore_streams(&target, dir.path())
        .await
        .unwrap_err();
    assert!(matches!(err, BackupError::NotAnArtefact(..)), "{err}");
}

/// The usage log is among the streams, each message with its position, so
/// an estate's position on it moves onto the restored log's numbering; the
/// estate's copy is checksummed like every file, and an artefact from a
/// node without the estate says so.
#[tokio::test]
async fn the_usage_log_and_the_estate_travel_with_their_positions() {
    let a = NatsServer::start();
    let js = fresh(&a).await;
    js.create_stream(jetstream::stream::Config {
        name: crewlet_bus::USAGE_LOG_STREAM.into(),
        subjects: vec![crewlet_bus::USAGE_LOG_SUBJECTS.into()],
        max_messages_per_subject: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    // Positions 1..4; the first is compacted away by the third.
    for object in ["a", "b", "a", "c"] {
        js.publish(format!("crewlet.usage.log.{object}"), "v".into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("backup-1");
    let mut w = Writer::create(&art, "n1").unwrap();
    std::fs::write(art.join("replicated.sqlite3"), b"the estate's copy").unwrap();
    w.add_estate("replicated.sqlite3", BTreeMap::from([("usage".into(), 3)]))
        .unwrap();
    backup::write_streams(&js, &mut w, "crewlet").await.unwrap();
    let manifest = w.finish().unwrap();
    let usage = manifest
        .files
        .iter()
        .find(|f| f.stream.as_deref() == Some(crewlet_bus::USAGE_LOG_STREAM))
        .expect("the usage log is backed up");
    assert_eq!(usage.messages, 3);
    let dump = std::fs::read(art.join(&usage.file)).unwrap();
    assert_eq!(backup::restored_position(&dump, 0, 3), Some(2));
    assert_eq!(backup::restored_position(&dump, 10, 4), Some(13));
    assert_eq!(backup::restored_position(&dump, 0, 1), Some(0));
    let read = backup::verify(&art).unwrap();
    assert_eq!(read.estate.map(|e| e.positions["usage"]), Some(3));
    assert_eq!(read.no_estate, None);
    std::fs::write(
        art.join("replicated.sqlite3"),
        b"the estate's copy, altered",
    )
    .unwrap();
    assert!(matches!(
        backup::verify(&art),
        Err(BackupError::Tampered { file }) if file == "replicated.sqlite3"
    ));

    let art = dir.path().join("backup-2");
    let mut w = Writer::create(&art, "n2").unwrap();
    w.no_estate("no `data` role");
    w.finish().unwrap();
    let read = backup::verify(&art).unwrap();
    assert_eq!(
        (read.estate, read.no_estate.as_deref()),
        (None, Some("no `data` role"))
    );
}
