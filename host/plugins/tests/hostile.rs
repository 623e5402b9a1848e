//! Hostile plugins (plugins/testdata): each misbehaviour fails its own call
//! with a typed fault, the host survives, a healthy plugin keeps answering
//! throughout, and a faulted instance is never entered again.

mod common;

use std::time::{Duration, Instant};

use common::{manifest, manifest_text, runtime};
use crewlet_plugins::runtime::{CacheOutcome, CallError, Fault, LoadError, Runtime, RuntimeConfig};
use crewlet_plugins::webhook::{Request, WebhookPlugin};

const GH_SECRET: &[u8] = b"It's a Secret to Everybody";
const GH_SIG: &str = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

async fn healthy_still_answers(github: &WebhookPlugin) {
    let req = Request::new(
        "/webhooks/github",
        &[("x-hub-signature-256", GH_SIG)],
        b"Hello, World!",
        &[("github_webhook_secret", GH_SECRET)],
        0,
    );
    assert_eq!(
        github.verify(&req).await.expect("github must not fault"),
        Ok(())
    );
}

fn misbehave(what: &[u8]) -> Request {
    Request::new("/webhooks/hostile", &[], what, &[], 0)
}

fn fault_of(result: Result<impl std::fmt::Debug, CallError>) -> Fault {
    match result {
        Err(CallError::Fault { fault, .. }) => fault,
        other => panic!("expected a fault, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_hostile_call_fails_typed_while_a_healthy_plugin_answers() {
    let (rt, _data) = runtime();
    let github = WebhookPlugin::load(&rt, manifest("webhooks/github")).unwrap();
    let hostile = WebhookPlugin::load(&rt, manifest("testdata/hostile-webhook")).unwrap();
    healthy_still_answers(&github).await;

    // Infinite loop: stopped at its 300 ms deadline, not later.
    let started = Instant::now();
    let fault = fault_of(hostile.parse(&misbehave(b"loop")).await);
    assert_eq!(
        fault,
        Fault::Timeout {
            deadline: Duration::from_millis(300)
        }
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    healthy_still_answers(&github).await;

    // 1 GiB allocation under a 64 MiB cap.
    match fault_of(hostile.parse(&misbehave(b"allocate-1gib")).await) {
        Fault::OutOfMemory { limit, requested } => {
            assert_eq!(limit, 64 * 1024 * 1024);
            assert!(requested > limit, "requested {requested}");
        }
        other => panic!("expected out-of-memory, got {other:?}"),
    }
    healthy_still_answers(&github).await;

    // A panic: a trap carrying what the plugin said on stderr.
    match fault_of(hostile.parse(&misbehave(b"panic")).await) {
        Fault::Trap { reason } => assert!(reason.contains("panics on purpose"), "{reason}"),
        other => panic!("expected a trap, got {other:?}"),
    }
    let report = hostile.health();
    assert!(report.degraded, "three faults in a row degrade: {report:?}");
    assert_eq!(report.consecutive_faults, 3);
    healthy_still_answers(&github).await;

    // Unbounded recursion.
    assert_eq!(
        fault_of(hostile.parse(&misbehave(b"recurse")).await),
        Fault::StackOverflow
    );
    healthy_still_answers(&github).await;

    // The same plugin answers an ordinary call on a fresh instance (a
    // re-entered trapped instance would refuse it) and recovers.
    let parsed = hostile.parse(&misbehave(b"fine")).await.unwrap().unwrap();
    assert!(parsed.deliveries.is_empty());
    let report = hostile.health();
    assert!(!report.degraded, "{report:?}");
    assert_eq!((report.total_faults, report.consecutive_faults), (4, 0));
    assert!(github.health().total_faults == 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_hostile_calls_do_not_stall_the_healthy_plugin() {
    let (rt, _data) = runtime();
    let github =
        std::sync::Arc::new(WebhookPlugin::load(&rt, manifest("webhooks/github")).unwrap());
    let hostile = std::sync::Arc::new(
        WebhookPlugin::load(&rt, manifest("testdata/hostile-webhook")).unwrap(),
    );
    let spinners: Vec<_> = (0..2)
        .map(|_| {
            let h = hostile.clone();
            tokio::spawn(async move { h.parse(&misbehave(b"loop")).await })
        })
        .collect();
    for _ in 0..20 {
        healthy_still_answers(&github).await;
    }
    for s in spinners {
        assert!(matches!(fault_of(s.await.unwrap()), Fault::Timeout { .. }));
    }
}

#[test]
fn a_component_of_an_unknown_major_version_is_refused_by_name() {
    let (rt, _data) = runtime();
    let err = WebhookPlugin::load(&rt, manifest("testdata/wrong-world"))
        .err()
        .expect("refused");
    assert!(
        matches!(err, LoadError::UnsupportedVersion { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("crewlet:plugin@1.0.0"), "{text}");
    assert!(text.contains("supports crewlet:plugin@0.2.x"), "{text}");
}

#[test]
fn a_component_whose_world_is_not_the_manifests_kind_is_refused() {
    let (rt, _data) = runtime();
    let m = manifest_text(
        "webhooks/github",
        "name = \"github\"\nversion = \"0.1.0\"\nkind = \"module\"\ncomponent = \"../../target/wasm32-wasip2/release/crewlet_webhook_github.wasm\"\n",
    );
    let Err(err) = rt.load_component(&m) else {
        panic!("a module manifest over a webhook component must be refused")
    };
    assert!(matches!(err, LoadError::WorldMismatch { .. }), "{err:?}");
    assert!(err.to_string().contains("field `kind`"), "{err}");
}

#[test]
fn the_artifact_cache_is_used_and_a_tampered_artifact_is_recompiled() {
    let data = tempfile::tempdir().unwrap();
    let config = RuntimeConfig {
        data_dir: Some(data.path().to_path_buf()),
        max_instances: 8,
    };
    let m = manifest("webhooks/github");
    let rt = Runtime::new(config.clone()).unwrap();
    assert_eq!(rt.load_component(&m).unwrap().1, CacheOutcome::Compiled);
    assert_eq!(rt.load_component(&m).unwrap().1, CacheOutcome::Hit);
    drop(rt);
    // A new engine with the same configuration reuses it.
    let rt = Runtime::new(config).unwrap();
    assert_eq!(rt.load_component(&m).unwrap().1, CacheOutcome::Hit);

    // Tamper with the artifact: refused and recompiled, never loaded.
    let cache = rt.cache_dir().unwrap();
    let artifact = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .expect("an artifact");
    let mut bytes = std::fs::read(&artifact).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&artifact, &bytes).unwrap();
    match rt.load_component(&m).unwrap().1 {
        CacheOutcome::Recompiled(reason) => assert!(reason.contains("digest"), "{reason}"),
        other => panic!("expected a recompile, got {other:?}"),
    }
    assert_eq!(rt.load_component(&m).unwrap().1, CacheOutcome::Hit);

    // A foreign artifact whose digest file was forged to match: wasmtime
    // refuses its header, and it is recompiled.
    let digest = artifact.with_extension("sha256");
    let foreign = b"not a wasmtime artifact".to_vec();
    std::fs::write(&artifact, &foreign).unwrap();
    use sha2::Digest;
    let hex: String = sha2::Sha256::digest(&foreign)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    std::fs::write(&digest, hex).unwrap();
    assert!(matches!(
        rt.load_component(&m).unwrap().1,
        CacheOutcome::Recompiled(_)
    ));
}

fn said(
    result: Result<
        Result<crewlet_plugins::webhook::Parsed, crewlet_plugins::webhook::ParseError>,
        CallError,
    >,
) -> String {
    match result.expect("no fault") {
        Err(crewlet_plugins::webhook::ParseError::MalformedBody(text)) => text,
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn nothing_is_ambient_unless_the_manifest_asks_for_scratch() {
    let (rt, data) = runtime();
    let plain = WebhookPlugin::load(&rt, manifest("testdata/hostile-webhook")).unwrap();
    assert_eq!(
        said(plain.parse(&misbehave(b"ambient")).await),
        "env=0 root=false clock=0"
    );
    assert_eq!(
        said(plain.parse(&misbehave(b"scratch")).await),
        "written=false escaped=false"
    );

    let with_scratch = manifest_text(
        "testdata/hostile-webhook",
        "name = \"hostile-webhook\"\nversion = \"0.1.0\"\nkind = \"webhook\"\nscratch = true\ncomponent = \"../../target/wasm32-wasip2/release/crewlet_test_hostile_webhook.wasm\"\n[webhook]\nroutes = [\"/webhooks/hostile\"]\n",
    );
    let scratchy = WebhookPlugin::load(&rt, with_scratch).unwrap();
    assert_eq!(
        said(scratchy.parse(&misbehave(b"scratch")).await),
        "written=true escaped=false"
    );
    let dir = data.path().join("plugin-scratch/hostile-webhook");
    assert_eq!(std::fs::read(dir.join("note.txt")).unwrap(), b"kept");
    assert!(!data.path().join("plugin-scratch/escape.txt").exists());
}
