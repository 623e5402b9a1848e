//! Module state on a real nats-server (ADR 202), below the module world:
//! buckets adopted rather than rewritten, listings certified like the
//! coordination layer's (the churn a naive listing fails under), and the
//! 64 MiB cap answered as `Full`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use crewlet_plugins::catalogue::BucketSpec;
use crewlet_plugins::manifest::BucketDecl;
use crewlet_plugins::state::{
    BackendError, KvState, MAX_BUCKET_BYTES, MAX_VALUE_BYTES, StateBackend,
};
use crewlet_testkit::NatsServer;
use futures::TryStreamExt;

fn owned(module: &str, local: &str, history: u8, ttl: Option<Duration>) -> BucketSpec {
    BucketSpec {
        name: format!("mod_{module}_{local}"),
        owner: module.into(),
        local: local.into(),
        decl: Some(BucketDecl {
            local: local.into(),
            history,
            ttl,
        }),
    }
}

async fn stream_config(client: &async_nats::Client, bucket: &str) -> jetstream::stream::Config {
    jetstream::new(client.clone())
        .get_stream(format!("KV_{bucket}"))
        .await
        .unwrap()
        .get_info()
        .await
        .unwrap()
        .config
}

/// A bucket is created once; a second start adopts it untouched; an
/// owner whose options changed rewrites only those, keeping what is in the
/// bucket; a reader never rewrites the owner's options.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_are_adopted_and_only_differing_owner_options_applied() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let state = KvState::nats(client.clone());
    let spec = owned("keeper", "notes", 1, None);

    let first = state.ensure_bucket(&spec).await.unwrap();
    assert!(first.created && first.reconfigured.is_empty(), "{first:?}");
    assert_eq!((first.replicas, first.wanted_replicas), (1, 1));
    state.put(&spec.name, "k", b"v".to_vec()).await.unwrap();
    let before = stream_config(&client, &spec.name).await;

    let again = state.ensure_bucket(&spec).await.unwrap();
    assert!(!again.created && again.reconfigured.is_empty(), "{again:?}");
    assert_eq!(
        stream_config(&client, &spec.name).await,
        before,
        "an unchanged spec rewrote the bucket"
    );

    let changed = owned("keeper", "notes", 4, Some(Duration::from_secs(3600)));
    let applied = state.ensure_bucket(&changed).await.unwrap();
    assert_eq!(applied.reconfigured, ["history", "age"], "{applied:?}");
    let after = stream_config(&client, &spec.name).await;
    assert_eq!(after.max_messages_per_subject, 4);
    assert_eq!(after.max_age, Duration::from_secs(3600));
    assert_eq!(
        (after.max_bytes, after.num_replicas),
        (before.max_bytes, before.num_replicas)
    );
    assert_eq!(
        state.get(&spec.name, "k").await.unwrap().map(|e| e.value),
        Some(b"v".to_vec()),
        "reconfiguring lost a value"
    );

    let reader = BucketSpec {
        decl: None,
        ..spec.clone()
    };
    let read = state.ensure_bucket(&reader).await.unwrap();
    assert!(!read.created && read.reconfigured.is_empty(), "{read:?}");
    assert_eq!(stream_config(&client, &spec.name).await, after);

    // A node configured for more replicas than the bucket has is told so,
    // and the bucket is left as it is.
    let wants_three = KvState::nats(client.clone()).with_replicas(3);
    let report = wants_three.ensure_bucket(&changed).await.unwrap();
    assert!(report.replicas_differ(), "{report:?}");
    assert_eq!((report.replicas, report.wanted_replicas), (1, 3));
    assert_eq!(stream_config(&client, &spec.name).await.num_replicas, 1);
}

/// The evidence's load (`crewlet-coord`'s
/// `naive_keys_listing_misses_live_keys_under_churn`: five keys, three
/// rewritten in tight loops) on a module bucket. The naive listing of the
/// same bucket misses a live key (the control: the load is one the hazard
/// shows under), and none of 3,000 of module state's listings — `keys()`
/// and a watch's current values — does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_a_watchs_current_values_hold_every_live_key_under_churn() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let state = Arc::new(KvState::nats(client.clone()));
    let spec = owned("churn", "seen", 1, None);
    state.ensure_bucket(&spec).await.unwrap();
    let bucket = spec.name.clone();
    let keys: BTreeSet<String> = (0..5).map(|i| format!("node.n{i}")).collect();
    for k in &keys {
        state.put(&bucket, k, b"x".to_vec()).await.unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let renewers: Vec<_> = (0..3)
        .map(|i| {
            let (state, stop, bucket) = (state.clone(), stop.clone(), bucket.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    state
                        .put(&bucket, &format!("node.n{i}"), b"x".to_vec())
                        .await
                        .unwrap();
                }
            })
        })
        .collect();

    let naive = jetstream::new(client.clone())
        .get_key_value(&bucket)
        .await
        .unwrap();
    let mut naive_listings = 0;
    loop {
        let got: BTreeSet<String> = naive.keys().await.unwrap().try_collect().await.unwrap();
        naive_listings += 1;
        if got != keys {
            break;
        }
        assert!(
            naive_listings < 3000,
            "the naive listing never missed in 3000 listings: this load no longer shows the hazard"
        );
    }

    for i in 0..3000 {
        let listed: Vec<String> = if i % 5 == 4 {
            let watch = state.watch(&bucket).await.unwrap();
            watch.current.into_iter().map(|e| e.key).collect()
        } else {
            state.keys(&bucket).await.unwrap()
        };
        let set: BTreeSet<String> = listed.iter().cloned().collect();
        assert_eq!(set.len(), listed.len(), "a key listed twice: {listed:?}");
        assert_eq!(
            set, keys,
            "listing {i} missed a live key (the naive one missed after {naive_listings})"
        );
    }
    stop.store(true, Ordering::SeqCst);
    for r in renewers {
        r.await.unwrap();
    }
}

/// Filled with 256 KiB values, a bucket refuses the write past its 64 MiB
/// as `Full` (the broker's error code, not its text); the values before it
/// stay readable, and a deletion makes room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_filled_to_its_64_mib_cap_answers_full() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let state = KvState::nats(client.clone());
    let spec = owned("filler", "blobs", 1, None);
    state.ensure_bucket(&spec).await.unwrap();
    let bucket = spec.name.clone();
    let value = vec![b'x'; MAX_VALUE_BYTES];
    let most = MAX_BUCKET_BYTES as usize / MAX_VALUE_BYTES;
    let mut refused = None;
    for i in 0..=most {
        match state
            .put(&bucket, &format!("blob.{i}"), value.clone())
            .await
        {
            Ok(_) => {}
            Err(e) => {
                refused = Some((i, e));
                break;
            }
        }
    }
    let (at, e) = refused.expect("a 64 MiB bucket took more than 64 MiB of values");
    assert_eq!(e, BackendError::Full(bucket.clone()));
    assert!(
        at + 2 >= most,
        "refused at value {at} of {most}: the cap is lower than 64 MiB"
    );
    let info = jetstream::new(client.clone())
        .get_stream(format!("KV_{bucket}"))
        .await
        .unwrap()
        .get_info()
        .await
        .unwrap();
    assert!(
        info.state.bytes <= MAX_BUCKET_BYTES as u64,
        "{:?}",
        info.state
    );
    assert_eq!(
        state.get(&bucket, &format!("blob.{at}")).await.unwrap(),
        None,
        "the refused write landed"
    );
    assert_eq!(
        state
            .get(&bucket, "blob.0")
            .await
            .unwrap()
            .map(|e| e.value.len()),
        Some(MAX_VALUE_BYTES)
    );
    state.delete(&bucket, "blob.0").await.unwrap();
    state
        .put(&bucket, &format!("blob.{at}"), value)
        .await
        .expect("a deletion made room");
}
