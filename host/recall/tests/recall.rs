//! The turns' memory ports over real store files and a real nats-server:
//! what a turn leaves (its episode, what it learned of whom it met, the
//! onboarding marker) is recalled on its node and follows the seat to
//! another node's store; so does what it said in a thread; carrying a
//! skill counts its use there too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use crewlet_memory::{Changelog, Memory, memory_tables};
use crewlet_recall::{NodeMemory, NodeSessions, NodeSkills};
use crewlet_store::{Learned, Origin, Store};
use crewlet_testkit::NatsServer;
use crewlet_turns::{Episode, Said, SeatMemory, Sessions, SkillSource, TurnMemory, Vector};

async fn memory(server: &NatsServer, store: &Arc<Store>) -> Memory {
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    crewlet_stream::streams::ensure_streams(&js, 1)
        .await
        .unwrap();
    memory_tables(Memory::open(js).await.unwrap(), store)
}

fn store() -> (tempfile::TempDir, Arc<Store>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open_in(dir.path()).unwrap());
    (dir, store)
}

/// Hydrates `seat` into `memory`'s store until `done` holds (the
/// changelog publishes after the write returns), within a generous bound.
async fn hydrated_until(memory: &Memory, seat: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        memory.hydrate(seat).await.unwrap();
        if done() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the rows never reached the other node"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_turns_end_is_recalled_here_and_follows_the_seat_to_another_node() {
    let server = NatsServer::start();
    let ((_a_dir, a), (_b_dir, b)) = (store(), store());
    let (changelog, _carrier) = Changelog::start(memory(&server, &a).await);
    let node = NodeMemory {
        store: a.clone(),
        changelog,
    };
    let vector = Vector {
        model: "local/embed".into(),
        values: vec![1.0, 0.0, 0.5],
    };
    let episode = Episode {
        seat: "ada".into(),
        turn_id: "t1".into(),
        conversation: Some("C1".into()),
        trigger: "deploy please".into(),
        asked_by: vec!["u7".into()],
        tools: vec!["deploy".into()],
        reply: Some("deployed".into()),
        outcome: "delivered".into(),
        input_tokens: 12,
        output_tokens: 3,
        summary: "deployed for u7".into(),
        ended_ms: 1_000,
        updated_ms: 1_000,
        vector: Some(vector.clone()),
        change_seq: 0,
    };
    node.ended(
        "ada",
        TurnMemory {
            episode: episode.clone(),
            met: vec![("u7".into(), "asked: deploy please".into())],
            onboarded: true,
        },
    )
    .await
    .unwrap();

    let recalled = node.episodes("ada", vector, 0.1, 5).await.unwrap();
    assert_eq!(recalled.len(), 1, "{recalled:?}");
    assert_eq!(recalled[0].text, "deployed for u7");
    assert!(recalled[0].distance.unwrap() < 1e-6, "{recalled:?}");
    let profile = node.profile("ada", "u7").await.unwrap().unwrap();
    assert!(profile.starts_with("1 turns with them"), "{profile}");
    assert!(profile.ends_with("asked: deploy please"), "{profile}");
    assert!(node.onboarded("ada").await.unwrap());
    assert!(!node.onboarded("bob").await.unwrap());

    let there = memory(&server, &b).await;
    hydrated_until(&there, "ada", || {
        b.onboarded("ada").unwrap().is_some() && b.profile("ada", "u7").unwrap().is_some()
    })
    .await;
    let kept = b
        .episode("ada", "t1")
        .unwrap()
        .expect("the episode followed");
    assert_eq!(
        Episode {
            change_seq: 0,
            ..kept
        },
        episode
    );
    assert_eq!(b.profile("ada", "u7").unwrap().unwrap().turns, 1);
}

#[tokio::test]
async fn carrying_a_skill_counts_its_use_and_the_use_follows_the_seat() {
    let server = NatsServer::start();
    let ((_a_dir, a), (_b_dir, b)) = (store(), store());
    let (changelog, _carrier) = Changelog::start(memory(&server, &a).await);
    a.learn_skill(
        &Learned {
            seat: "ada",
            name: "Deploy check",
            origin: Origin::Induced,
            promoted_from: &[],
            procedure: "1. read the run",
            episodes: &[],
            model: "local/m",
        },
        10,
    )
    .unwrap();
    let skills = NodeSkills {
        store: a.clone(),
        changelog,
    };
    let carried = skills.skills("ada", "deploy please").await.unwrap();
    assert_eq!(
        carried,
        vec!["Deploy check (v1): 1. read the run".to_owned()]
    );
    assert!(skills.skills("bob", "hi").await.unwrap().is_empty());
    assert_eq!(a.skills("ada").unwrap()[0].skill.uses, 1);

    let there = memory(&server, &b).await;
    hydrated_until(&there, "ada", || {
        b.skills("ada")
            .unwrap()
            .first()
            .is_some_and(|h| h.skill.uses == 1)
    })
    .await;
}

#[tokio::test]
async fn what_a_seat_said_in_a_thread_is_read_back_and_follows_the_seat() {
    let server = NatsServer::start();
    let ((_a_dir, a), (_b_dir, b)) = (store(), store());
    let (changelog, _carrier) = Changelog::start(memory(&server, &a).await);
    let here = NodeSessions {
        store: a.clone(),
        changelog,
    };
    let said = vec![Said {
        turn_id: "t1".into(),
        text: "deployed v2".into(),
        at_ms: 5,
    }];
    here.remember("ada", "C1#1", &said, 5).unwrap();
    assert_eq!(here.said("ada", "C1#1").unwrap(), said);
    assert!(here.said("ada", "C1#2").unwrap().is_empty());

    let (other, _carrier_b) = Changelog::start(memory(&server, &b).await);
    let there = NodeSessions {
        store: b.clone(),
        changelog: other,
    };
    let replay = memory(&server, &b).await;
    hydrated_until(&replay, "ada", || {
        !there.said("ada", "C1#1").unwrap().is_empty()
    })
    .await;
    assert_eq!(there.said("ada", "C1#1").unwrap(), said);
}
