//! The webhook edge against a real nats-server and the real GitHub plugin,
//! with the claims bucket answering "unknown" while JetStream publishing
//! works: the one case where the edge must publish without a claim.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer;
use common::World;
use crewlet_bus::{INBOUND_SUBJECT, Inbound, NOTIFICATIONS_STREAM};
use crewlet_ingress::sign::github_signature;
use crewlet_ingress::{Edge, EdgeConfig, Outcome};
use crewlet_plugins::webhook::WebhookPlugin;
use crewlet_plugins::{Manifest, Runtime, RuntimeConfig};
use futures::StreamExt;
use http::{HeaderMap, HeaderValue};

const SECRET: &str = "edge-test-secret";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_claim_fails_open_the_delivery_is_published_and_answered_202() {
    let w = World::start().await;
    let probe = probe(&w).await;
    let (edge, _plugin_data) = github_edge(&w);

    // Claim keys are `SOURCE:DELIVERY_ID`; writes to this one never land
    // and answer unavailable. Everything else, publishing included, works.
    let delivery = "unknown-claim-1";
    w.faulty.fail_writes_to(Some(delivery));
    let (headers, body) = signed_comment(delivery);
    let route = edge.resolve("github", None).unwrap();
    let outcome = edge.deliver(&route, &headers, body.into()).await;
    let Outcome::Accepted(traces) = &outcome else {
        panic!("not accepted: {outcome:?}");
    };
    assert_eq!(traces.len(), 1);
    assert_eq!(outcome.status(), 202);

    // On the stream, once.
    let published = drain(&probe).await;
    assert_eq!(published.len(), 1, "{published:?}");
    assert_eq!(published[0].key, format!("github:{delivery}"));
    assert_eq!(published[0].trace_id, traces[0]);
    assert!(published[0].mentions.iter().any(|m| m.contains("ada")));

    // Failed open, not claimed: the row says so and no claim landed.
    let received = w.events("webhook_received");
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].payload["claimed"], false, "{:?}", received[0]);
    let claims = w.js.get_key_value("crewlet_claims").await.unwrap();
    let key = crewlet_coord::names::encode_token(&format!("github:{delivery}"));
    assert_eq!(claims.get(&key).await.unwrap(), None);
}

/// A retry of a delivery whose claim another attempt took and whose
/// publish never happened (that attempt answered 503 and its release had
/// not landed yet): the claim says somebody tried, not that the stream has
/// it. The retry publishes it (202); the next one is a duplicate (200), and
/// the stream holds one copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_attempt_never_published_does_not_make_the_retry_a_duplicate() {
    let w = World::start().await;
    let probe = probe(&w).await;
    let (edge, _plugin_data) = github_edge(&w);
    let delivery = "orphan-claim-1";
    let held = w
        .coord
        .claim_delivery(
            &format!("github:{delivery}"),
            "peer/an-attempt-whose-publish-failed",
            crewlet_ingress::webhook::CLAIM_TTL,
        )
        .await
        .unwrap();
    assert!(held.is_yes(), "{held:?}");

    let (headers, body) = signed_comment(delivery);
    let route = edge.resolve("github", None).unwrap();
    let retry = edge.deliver(&route, &headers, body.clone().into()).await;
    assert!(matches!(retry, Outcome::Accepted(_)), "{retry:?}");
    let again = edge.deliver(&route, &headers, body.into()).await;
    assert!(matches!(again, Outcome::Duplicate), "{again:?}");
    assert_eq!(again.status(), 200);

    let published = drain(&probe).await;
    assert_eq!(published.len(), 1, "{published:?}");
    assert_eq!(published[0].key, format!("github:{delivery}"));
}

/// What the notification service would be: interest that keeps the
/// delivery on the stream, read back here instead of worked.
async fn probe(w: &World) -> consumer::PullConsumer {
    w.js.get_stream(NOTIFICATIONS_STREAM)
        .await
        .unwrap()
        .create_consumer(consumer::pull::Config {
            durable_name: Some("edge-probe".into()),
            filter_subject: INBOUND_SUBJECT.into(),
            ..Default::default()
        })
        .await
        .unwrap()
}

/// Every delivery on the stream the probe has not read yet, acked.
async fn drain(probe: &consumer::PullConsumer) -> Vec<Inbound> {
    let mut batch = probe
        .fetch()
        .max_messages(10)
        .expires(Duration::from_secs(1))
        .messages()
        .await
        .unwrap();
    let mut published = Vec::new();
    while let Some(m) = batch.next().await {
        let m = m.unwrap();
        m.ack().await.unwrap();
        published.push(serde_json::from_slice::<Inbound>(&m.payload).unwrap());
    }
    published
}

/// An edge serving the real GitHub plugin on `w`, every secret `SECRET`;
/// the plugin's data dir lives as long as the second value.
fn github_edge(w: &World) -> (Edge, tempfile::TempDir) {
    let plugin_data = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(RuntimeConfig {
        data_dir: Some(plugin_data.path().to_path_buf()),
        ..RuntimeConfig::default()
    })
    .unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let manifest = Manifest::load(&root.join("plugins/webhooks/github/plugin.toml")).unwrap();
    let github = Arc::new(WebhookPlugin::load(&runtime, manifest).unwrap());
    let edge = Edge::new(EdgeConfig {
        node_id: "edge-test".into(),
        client: w.client.clone(),
        deliveries: w.coord.deliveries(),
        publisher: w.publisher.clone(),
        active: w.active.clone(),
        plugins: crewlet_plugins::Installed::webhooks_only(vec![github]),
        secrets: crewlet_secrets::Resolver::new(|_| {
            crewlet_secrets::Lookup::Found(SECRET.to_owned())
        }),
        refused_log: None,
    });
    (edge, plugin_data)
}

/// A signed GitHub `issue_comment` mentioning `@ada`, as delivery `id`.
fn signed_comment(id: &str) -> (HeaderMap, Vec<u8>) {
    let body = crewlet_testkit::github::issue_comment("acme/robot", 7, "@ada could you look?");
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("content-type", "application/json".to_owned()),
        ("x-github-event", "issue_comment".to_owned()),
        ("x-github-delivery", id.to_owned()),
        (
            "x-hub-signature-256",
            github_signature(SECRET.as_bytes(), &body),
        ),
    ] {
        headers.insert(name, HeaderValue::from_str(&value).unwrap());
    }
    (headers, body)
}
