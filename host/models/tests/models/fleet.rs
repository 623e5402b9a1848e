//! Cooldowns as fleet state, over a real nats-server: the periodic pull
//! picks up a peer's bench (never shortening one), and a coordination
//! outage leaves the local bench working.

use crate::common;

use std::time::{Duration, Instant, SystemTime};

use common::{Host, Node, model, request, resolver, site};
use crewlet_coord::key_hint;
use crewlet_models::{Models, ModelsOptions};
use crewlet_testkit::{NatsServer, Reply, ScriptedOpenAi};
use crewlet_turns::Msg;

const KEY_1: &str = "live-key-0001-aaaaaaaaaaaa";
const KEY_2: &str = "live-key-0002-bbbbbbbbbbbb";

/// Polls `done` until it holds or `within` passes.
async fn eventually(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    done()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_puller_merges_a_peer_bench_and_never_shortens_its_own() {
    let nats = NatsServer::start();
    let server = ScriptedOpenAi::start();
    let host = Host::new();
    let node = Node::join(&nats, "node-a").await;
    let models = Models::new(
        crewlet_plugins::Installed::providers_only(vec![host.openai(&server)]),
        node.coord.model_cooldowns(),
        Some(node.publisher.clone()),
        resolver(&[("K1", KEY_1), ("K2", KEY_2)]),
        ModelsOptions {
            pull_every: Duration::from_millis(100),
            ..ModelsOptions::default()
        },
    )
    .await;
    let entry = model("openai", "gpt-a", &["K1", "K2"]);
    let pkey = models.provider_key(&entry).unwrap();
    let hint = key_hint(KEY_1);
    assert!(
        models
            .pool()
            .cooling_until(&pkey, &hint, SystemTime::now())
            .is_none()
    );

    // A peer benches K1 for the fleet; the next pull brings it here.
    let peer = Node::join(&nats, "node-b").await;
    let until = SystemTime::now() + Duration::from_secs(120);
    peer.coord.bench(pkey.as_str(), &hint, until).await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || {
            models.pool().cooling_until(&pkey, &hint, SystemTime::now()) == Some(until_ms(until))
        })
        .await,
        "the periodic pull merged the peer's bench"
    );
    server.reply("gpt-a", Reply::Text("k2".into()));
    let a = models
        .call(
            std::slice::from_ref(&entry),
            request(vec![Msg::user("hi")]),
            &site("t1"),
        )
        .await
        .unwrap();
    assert_eq!(a.key_hint, Some(key_hint(KEY_2)));

    // A longer local bench is not shortened by the fleet's shorter record.
    let longer = SystemTime::now() + Duration::from_secs(900);
    models.pool().bench(&pkey, &hint, longer);
    models.pull_now().await;
    assert_eq!(
        models.pool().cooling_until(&pkey, &hint, SystemTime::now()),
        Some(longer)
    );
    models.shutdown().await;
}

/// The store keeps milliseconds.
fn until_ms(t: SystemTime) -> SystemTime {
    let ms = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_coordination_down_the_local_bench_still_rotates_keys() {
    let mut nats = NatsServer::start();
    let server = ScriptedOpenAi::start();
    let host = Host::new();
    let node = Node::join(&nats, "node-a").await;
    let models = Models::new(
        crewlet_plugins::Installed::providers_only(vec![host.openai(&server)]),
        node.coord.model_cooldowns(),
        None,
        resolver(&[("K1", KEY_1), ("K2", KEY_2)]),
        ModelsOptions::default(),
    )
    .await;
    nats.kill();
    let entry = model("openai", "gpt-a", &["K1", "K2"]);
    server.reply("gpt-a", Reply::rate_limited(60));
    server.reply("gpt-a", Reply::Text("k2".into()));
    let started = Instant::now();
    let a = models
        .call(
            std::slice::from_ref(&entry),
            request(vec![Msg::user("hi")]),
            &site("t1"),
        )
        .await
        .unwrap();
    assert_eq!(a.key_hint, Some(key_hint(KEY_2)));
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the fleet write holds the retry up for at most 2 s: {:?}",
        started.elapsed()
    );
    // The pull cannot read the store: a no-op, not an un-benching.
    assert!(models.pull_now().await.is_empty());
    server.reply("gpt-a", Reply::Text("k2 again".into()));
    let b = models
        .call(&[entry], request(vec![Msg::user("hi")]), &site("t2"))
        .await
        .unwrap();
    assert_eq!(b.key_hint, Some(key_hint(KEY_2)));
    let with_key_1 = server
        .requests()
        .iter()
        .filter(|r| r.bearer.as_deref() == Some(KEY_1))
        .count();
    assert_eq!(with_key_1, 1);
    models.shutdown().await;
}
