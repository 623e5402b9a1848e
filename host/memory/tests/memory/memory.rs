//! The memory changelog against a real nats-server and real store files:
//! a seat's rows written on one node hydrate another's store; a newer local
//! row is kept; a row too large for the stream is refused with a clear
//! error and kept locally; a stream that cannot be read is unknown, never
//! "nothing to remember".

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use crewlet_memory::{
    Changelog, Diary, Episodes, Memory, MemoryError, Onboarding, Profiles, Sessions,
};
use crewlet_store::{DiaryNote, Episode, Onboarded, Profile, Said, SessionRow, Store, Vector};
use crewlet_testkit::NatsServer;

use crate::common::{self, store};

async fn memory(server: &NatsServer, store: &Arc<Store>) -> Memory {
    common::changelog(server)
        .await
        .with(Sessions(store.clone()))
        .with(Diary(store.clone()))
        .with(Episodes(store.clone()))
        .with(Profiles(store.clone()))
        .with(Onboarding(store.clone()))
}

fn said(text: &str) -> Said {
    Said {
        turn_id: "t1".into(),
        text: text.into(),
        at_ms: 1,
    }
}

/// Remembers on `store` and offers the whole row to the changelog, as the
/// node does after every turn.
fn remember(store: &Store, log: &Changelog, seat: &str, conv: &str, text: &str, at: i64) {
    store.remember(seat, conv, &[said(text)], at).unwrap();
    let row = store.session_row(seat, conv).unwrap().unwrap();
    log.offer::<Sessions>(&row).unwrap();
}

#[tokio::test]
async fn a_seats_sessions_written_on_one_node_hydrate_anothers_store() {
    let server = NatsServer::start();
    let (_a_dir, a) = store();
    let (_b_dir, b) = store();
    let (log, task) = Changelog::start(memory(&server, &a).await);
    remember(&a, &log, "ada", "C1#17.1", "Hi, the build is green.", 10);
    remember(&a, &log, "ada", "C1#17.1", "It deploys too.", 20);
    remember(&a, &log, "ada", "C2#3.3", "Lunch at noon.", 30);
    remember(&a, &log, "bob", "C1#17.1", "bob here", 40);
    log.close(Duration::from_secs(10)).await;
    task.await.unwrap();

    let on_b = memory(&server, &b).await;
    // A row of a table this build does not know (a newer peer's) is
    // skipped, not an outage.
    let raw = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    raw.publish("crewlet.memory.ada.future.00ff", "{}".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let done = on_b.hydrate("ada").await.unwrap();
    assert_eq!(
        (done.rows, done.written, done.kept_local, done.skipped),
        (3, 2, 0, 1),
        "one message per conversation (the newest), the unknown table skipped: {done:?}"
    );
    assert_eq!(
        b.session_row("ada", "C1#17.1").unwrap(),
        a.session_row("ada", "C1#17.1").unwrap()
    );
    let thread = b.session("ada", "C1#17.1").unwrap();
    assert_eq!(thread.turns, 2);
    assert_eq!(
        thread
            .said
            .iter()
            .map(|s| s.text.as_str())
            .collect::<Vec<_>>(),
        ["Hi, the build is green.", "It deploys too."]
    );
    assert_eq!(b.session_count("ada").unwrap(), 2);
    assert_eq!(b.session_count("bob").unwrap(), 0, "only the seat acquired");

    // Again: nothing new, the same rows written again (a tie is written).
    let again = on_b.hydrate("ada").await.unwrap();
    assert_eq!((again.rows, again.kept_local), (3, 0));
    // A seat with no memory hydrates to nothing, at once.
    assert_eq!(on_b.hydrate("cyd").await.unwrap().rows, 0);
}

#[tokio::test]
async fn a_newer_row_on_the_acquiring_node_is_kept() {
    let server = NatsServer::start();
    let (_a_dir, a) = store();
    let (_b_dir, b) = store();
    let on_a = memory(&server, &a).await;
    a.remember("ada", "C1#1", &[said("old, from the stream")], 10)
        .unwrap();
    on_a.publish::<Sessions>(&a.session_row("ada", "C1#1").unwrap().unwrap())
        .await
        .unwrap();
    b.remember("ada", "C1#1", &[said("newer, written here")], 50)
        .unwrap();
    let mine = b.session_row("ada", "C1#1").unwrap();
    let done = memory(&server, &b).await.hydrate("ada").await.unwrap();
    assert_eq!((done.rows, done.written, done.kept_local), (1, 0, 1));
    assert_eq!(b.session_row("ada", "C1#1").unwrap(), mine);
}

#[tokio::test]
async fn a_row_too_large_for_the_stream_is_refused_clearly_and_kept_locally() {
    let server = NatsServer::start();
    let (_dir, a) = store();
    let on_a = memory(&server, &a).await;
    let (log, task) = Changelog::start(on_a.clone());
    let huge = "x".repeat(on_a.limit() + 1);
    a.remember("ada", "C1#big", &[said(&huge)], 10).unwrap();
    let row: SessionRow = a.session_row("ada", "C1#big").unwrap().unwrap();
    let err = log.offer::<Sessions>(&row).unwrap_err();
    match &err {
        MemoryError::TooLarge {
            seat,
            table,
            key,
            bytes,
            limit,
        } => {
            assert_eq!(
                (seat.as_str(), *table, key.as_str()),
                ("ada", "sessions", "C1#big")
            );
            assert!(bytes > limit, "{bytes} > {limit}");
            assert_eq!(*limit, 512 * 1024, "the stream's max_msg_size");
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("stays in this node's store") && text.contains("max_msg_size"),
        "{text}"
    );
    // The local row is whole, and the stream holds nothing of it.
    assert_eq!(
        a.session("ada", "C1#big").unwrap().said[0].text.len(),
        huge.len()
    );
    log.close(Duration::from_secs(10)).await;
    task.await.unwrap();
    let (_b_dir, b) = store();
    assert_eq!(
        memory(&server, &b).await.hydrate("ada").await.unwrap().rows,
        0
    );
    // The connection survived: the next row of a normal size goes through.
    on_a.publish::<Sessions>(&SessionRow {
        conversation: "C1#small".into(),
        said: vec![said("fine")],
        ..row
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_stream_that_cannot_be_read_is_unknown_not_empty() {
    let mut server = NatsServer::start();
    let (_dir, b) = store();
    let on_b = memory(&server, &b).await;
    server.kill();
    let err = tokio::time::timeout(Duration::from_secs(60), on_b.hydrate("ada"))
        .await
        .expect("the hydration answers within its bounds")
        .unwrap_err();
    assert!(
        matches!(err, MemoryError::Unreadable { ref seat, .. } if seat == "ada"),
        "{err:?}"
    );
    assert!(err.to_string().contains("not given work"), "{err}");
}

#[tokio::test]
async fn notes_episodes_profiles_and_the_onboarding_marker_follow_the_seat() {
    let server = NatsServer::start();
    let (_a_dir, a) = store();
    let (log, task) = Changelog::start(memory(&server, &a).await);
    let vector = Vector {
        model: "scripted/bag".into(),
        values: vec![0.6, 0.8],
    };
    let note = a
        .put_note(&DiaryNote {
            seat: "ada".into(),
            note_id: "n1".into(),
            text: "The deploy key lives in vault/ci.".into(),
            turn_id: Some("t1".into()),
            created_ms: 10,
            updated_ms: 10,
            vector: Some(vector.clone()),
            change_seq: 0,
        })
        .unwrap();
    log.offer::<Diary>(&note).unwrap();
    let episode = a
        .put_episode(&Episode {
            seat: "ada".into(),
            turn_id: "t1".into(),
            conversation: Some("C1#1".into()),
            trigger: "where is the deploy key?".into(),
            asked_by: vec!["U1".into()],
            tools: vec!["remember".into()],
            reply: Some("in vault/ci".into()),
            outcome: "delivered".into(),
            input_tokens: 7,
            output_tokens: 3,
            summary: "told U1 where the deploy key is".into(),
            ended_ms: 11,
            updated_ms: 11,
            vector: Some(vector.clone()),
            change_seq: 0,
        })
        .unwrap();
    log.offer::<Episodes>(&episode).unwrap();
    let profile = a
        .put_profile(&Profile {
            seat: "ada".into(),
            counterparty: "U1".into(),
            known: "asked: where is the deploy key?".into(),
            turns: 1,
            first_ms: 11,
            last_ms: 11,
            updated_ms: 11,
            change_seq: 0,
        })
        .unwrap();
    log.offer::<Profiles>(&profile).unwrap();
    let marker = a
        .mark_onboarded(&Onboarded {
            seat: "ada".into(),
            turn_id: "t1".into(),
            onboarded_ms: 11,
            updated_ms: 11,
            change_seq: 0,
        })
        .unwrap();
    log.offer::<Onboarding>(&marker).unwrap();
    log.close(Duration::from_secs(10)).await;
    task.await.unwrap();

    // Another node (or this one with its file lost) rebuilds it all.
    let (_b_dir, b) = store();
    let done = memory(&server, &b).await.hydrate("ada").await.unwrap();
    assert_eq!(
        (done.rows, done.written, done.skipped),
        (4, 4, 0),
        "{done:?}"
    );
    let recalled = b.recall_notes("ada", Some(&vector), 0.1, 5).unwrap();
    assert_eq!(recalled.len(), 1);
    assert_eq!(recalled[0].row.text, note.text);
    assert_eq!(recalled[0].row.vector, note.vector);
    let similar = b.recall_episodes("ada", &vector, 0.1, 5).unwrap();
    assert_eq!(similar[0].row.summary, episode.summary);
    assert_eq!(
        b.profile("ada", "U1").unwrap().unwrap().known,
        profile.known
    );
    assert_eq!(b.onboarded("ada").unwrap().unwrap().turn_id, "t1");
    // Stamped from B's own sequence as they landed.
    assert_eq!(b.memory_change_sequence().unwrap(), 4);
}
