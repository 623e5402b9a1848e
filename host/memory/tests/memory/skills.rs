//! What a seat learned follows the seat: a skill with two versions written
//! on one node's store, offered to the changelog, hydrates another node's
//! store whole (real nats-server, real store files).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use crewlet_memory::{Changelog, Memory, SkillVersions, Skills};
use crewlet_store::{Learned, Origin, Store};
use crewlet_testkit::NatsServer;

async fn memory(server: &NatsServer, store: &Arc<Store>) -> Memory {
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    crewlet_stream::streams::ensure_streams(&js, 1)
        .await
        .unwrap();
    Memory::open(js)
        .await
        .unwrap()
        .with(Skills(store.clone()))
        .with(SkillVersions(store.clone()))
}

#[tokio::test]
async fn a_skill_and_every_version_follow_the_seat_to_another_node() {
    let server = NatsServer::start();
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Arc::new(Store::open_in(a_dir.path()).unwrap());
    let b = Arc::new(Store::open_in(b_dir.path()).unwrap());
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
