//! What a seat learned follows the seat (real nats-server, real store
//! files): a skill with two versions written on one node's store, offered
//! to the changelog, hydrates another node's store whole; the reflection
//! watermark the duty kept follows the seat too, and a lower one never
//! moves it back. And the live tail (node W writes, node H holds the
//! seat): a row W writes while H hydrates, and one after, reach H's store
//! without another hydration; a row of a seat H does not hold, or no
//! longer holds, does not.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crewlet_memory::{Changelog, Memory, ReflectionMarks, SkillVersions, Skills, Tail};
use crewlet_store::{Learned, Origin, ReflectionMark, Store};
use crewlet_testkit::NatsServer;
use futures::StreamExt;

use crate::common::{self, store};

async fn memory(server: &NatsServer, store: &Arc<Store>) -> Memory {
    common::changelog(server)
        .await
        .with(Skills(store.clone()))
        .with(SkillVersions(store.clone()))
        .with(ReflectionMarks(store.clone()))
}

#[tokio::test]
async fn a_skill_and_every_version_follow_the_seat_to_another_node() {
    let server = NatsServer::start();
    let ((_a_dir, a), (_b_dir, b)) = (store(), store());
    let (log, task) = Changelog::start(memory(&server, &a).await);
    for (at, procedure) in [(10, "1. read the run"), (20, "1. read the run 2. link it")] {
        let (skill, version) = a
            .learn_skill(
                &Learned {
                    seat: "ada",
                    name: "Deploy check",
                    origin: Origin::Induced,
                    promoted_from: &[],
                    procedure,
                    episodes: &["t1".into()],
                    model: "openai/reflect",
                },
                at,
            )
            .unwrap();
        log.offer::<Skills>(&skill).unwrap();
        log.offer::<SkillVersions>(&version).unwrap();
    }
    log.close(Duration::from_secs(10)).await;
    task.await.unwrap();

    let done = memory(&server, &b).await.hydrate("ada").await.unwrap();
    assert_eq!(
        (done.rows, done.written),
        (3, 3),
        "one skill row (its newest), two versions: {done:?}"
    );
    assert_eq!(b.skills("ada").unwrap(), a.skills("ada").unwrap());
    assert_eq!(
        b.active_skills("ada", 5).unwrap()[0].1,
        "1. read the run 2. link it"
    );
}

/// Learns `name` for `seat` on `store` and publishes both rows.
async fn learn(w: &Memory, store: &Store, seat: &str, name: &str, at: i64) {
    let (skill, version) = store
        .learn_skill(
            &Learned {
                seat,
                name,
                origin: Origin::Induced,
                promoted_from: &[],
                procedure: "1. look 2. answer",
                episodes: &["t1".into()],
                model: "openai/reflect",
            },
            at,
        )
        .unwrap();
    w.publish::<Skills>(&skill).await.unwrap();
    w.publish::<SkillVersions>(&version).await.unwrap();
}

/// Waits (generously) until `seat` has a skill named `name` in `store`.
async fn arrives(store: &Store, seat: &str, name: &str) -> bool {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if store
            .skills(seat)
            .unwrap()
            .iter()
            .any(|s| s.skill.name == name)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn rows_written_elsewhere_reach_the_holder_while_it_holds_the_seat() {
    let server = NatsServer::start();
    let ((_wd, w_store), (_hd, h_store)) = (store(), store());
    let w = memory(&server, &w_store).await;
    let h = memory(&server, &h_store).await;
    let (tail, task) = Tail::start(h.clone()).await.unwrap();
    learn(&w, &w_store, "ada", "Before", 10).await;

    // Watched, then a row lands before the pass: the pass or the tail
    // applies it, once.
    tail.watch("ada").await;
    learn(&w, &w_store, "ada", "During", 20).await;
    let hydrated = h.hydrate("ada").await.unwrap();
    assert_eq!(hydrated.rows, 4, "{hydrated:?}");
    let caught_up = tail.live("ada", hydrated.reached).await;
    assert_eq!(caught_up, 0, "the pass reached every held row");
    learn(&w, &w_store, "ada", "After", 30).await;
    assert!(
        arrives(&h_store, "ada", "After").await,
        "a row written after the hydration never reached the holder"
    );

    // cy is held with nothing to hydrate: its rows, published after
    // another's, say the tail has seen that other row.
    tail.watch("cy").await;
    tail.live("cy", 0).await;

    // Held while hydrating and past what the pass reached: applied by live.
    tail.watch("ada").await;
    let stale = h.hydrate("ada").await.unwrap();
    learn(&w, &w_store, "ada", "Raced", 40).await;
    learn(&w, &w_store, "cy", "Barrier one", 41).await;
    assert!(arrives(&h_store, "cy", "Barrier one").await);
    assert!(
        !h_store
            .skills("ada")
            .unwrap()
            .iter()
            .any(|s| s.skill.name == "Raced"),
        "a row of a seat still hydrating was applied before the pass ended"
    );
    assert_eq!(
        tail.live("ada", stale.reached).await,
        2,
        "the skill and its version"
    );
    assert!(arrives(&h_store, "ada", "Raced").await);

    // A seat not held, and one let go, are not applied.
    learn(&w, &w_store, "bob", "Not held", 50).await;
    tail.forget("ada");
    learn(&w, &w_store, "ada", "Gone", 60).await;
    learn(&w, &w_store, "cy", "Barrier two", 70).await;
    assert!(arrives(&h_store, "cy", "Barrier two").await);
    assert!(h_store.skills("bob").unwrap().is_empty());
    assert!(
        !h_store
            .skills("ada")
            .unwrap()
            .iter()
            .any(|s| s.skill.name == "Gone")
    );
    task.abort();
}

/// A seat with no rows (every seat of a new company) is hydrated by the
/// leader's answer alone: no consumer is asked for. Its first row, written
/// after, reaches the holder through the tail.
#[tokio::test]
async fn a_seat_with_no_rows_is_hydrated_without_a_consumer_and_its_first_row_still_arrives() {
    let server = NatsServer::start();
    let ((_wd, w_store), (_hd, h_store)) = (store(), store());
    let w = memory(&server, &w_store).await;
    let h = memory(&server, &h_store).await;
    let (tail, task) = Tail::start(h.clone()).await.unwrap();
    learn(&w, &w_store, "ada", "Someone else's", 10).await;
    // Every consumer made from here on is seen asked for.
    let watcher = async_nats::connect(server.url()).await.unwrap();
    let mut creates = watcher
        .subscribe("$JS.API.CONSUMER.CREATE.>")
        .await
        .unwrap();
    watcher.flush().await.unwrap();

    tail.watch("cy").await;
    let hydrated = h.hydrate("cy").await.unwrap();
    assert_eq!((hydrated.rows, hydrated.reached), (0, 0), "{hydrated:?}");
    assert_eq!(tail.live("cy", hydrated.reached).await, 0);
    // A seat with rows still makes its pass's consumer: the watch sees one.
    tail.watch("ada").await;
    let ada = h.hydrate("ada").await.unwrap();
    assert_eq!(ada.rows, 2, "{ada:?}");
    // The requests arrive in the order they were made: cy's, had there
    // been one, before ada's.
    let (ada_filter, cy_filter) = (
        crewlet_bus::memory_filter("ada"),
        crewlet_bus::memory_filter("cy"),
    );
    loop {
        let asked = tokio::time::timeout(Duration::from_secs(5), creates.next())
            .await
            .expect("ada's pass asked for its consumer")
            .unwrap();
        let body = String::from_utf8_lossy(&asked.payload).into_owned();
        assert!(
            !body.contains(&format!("\"{cy_filter}\"")),
            "cy's hydration asked for a consumer: {body}"
        );
        if body.contains(&format!("\"{ada_filter}\"")) {
            break;
        }
    }

    learn(&w, &w_store, "cy", "First", 20).await;
    assert!(
        arrives(&h_store, "cy", "First").await,
        "the first row of a seat hydrated empty never reached the holder"
    );
    task.abort();
}

#[tokio::test]
async fn the_reflection_watermark_follows_the_seat_and_only_moves_forward() {
    let server = NatsServer::start();
    let ((_wd, w_store), (_nd, next)) = (store(), store());
    let w = memory(&server, &w_store).await;
    let mark = |at: i64| ReflectionMark {
        seat: "ada".into(),
        reflected_ms: at,
        updated_ms: at,
    };
    for at in [100, 300] {
        w_store.put_reflection_marks(&[mark(at)]).unwrap();
        w.publish::<ReflectionMarks>(&mark(at)).await.unwrap();
    }
    assert_eq!(
        w_store.put_reflection_marks(&[mark(200)]).unwrap(),
        [crewlet_store::Applied::KeptLocal],
        "a lower mark moved the watermark back"
    );
    assert_eq!(w_store.reflection_mark("ada").unwrap(), Some(mark(300)));

    // The duty's next holder reads the same watermark after the replay.
    assert_eq!(next.reflection_mark("ada").unwrap(), None);
    let done = memory(&server, &next).await.hydrate("ada").await.unwrap();
    assert_eq!((done.rows, done.written), (1, 1), "{done:?}");
    assert_eq!(next.reflection_mark("ada").unwrap(), Some(mark(300)));
}
