//! Hostile plugins (plugins/testdata): each misbehaviour fails its own call
//! with a typed fault, the host survives, a healthy plugin keeps answering
//! throughout, a faulted instance is never entered again, repeated faults
//! quarantine the plugin, and nothing it says repeats a secret.

use crate::common;

use std::time::{Duration, Instant};

use common::{manifest, manifest_text, runtime};
use crewlet_plugins::Blame;
use crewlet_plugins::breaker::{BreakerPolicy, BreakerState};
use crewlet_plugins::manifest::{Kind, Manifest};
use crewlet_plugins::runtime::{CacheOutcome, CallError, Fault, LoadError, Runtime, RuntimeConfig};
use crewlet_plugins::webhook::{Request, Unbounded, WebhookPlugin, check_bounds};

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

/// A runtime whose breakers open after 5 faults and probe after 200 ms.
fn quick_breaker() -> (std::sync::Arc<Runtime>, tempfile::TempDir) {
    let data = tempfile::tempdir().unwrap();
    let rt = Runtime::new(RuntimeConfig {
        data_dir: Some(data.path().to_path_buf()),
        max_instances: 16,
        breaker: BreakerPolicy {
            first_backoff: Duration::from_millis(200),
            ..BreakerPolicy::default()
        },
        ..RuntimeConfig::default()
    })
    .unwrap();
    (rt, data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_hostile_call_fails_typed_while_a_healthy_plugin_answers() {
    let (rt, _data) = quick_breaker();
    let github = WebhookPlugin::load(&rt, manifest("webhooks/github")).unwrap();
    let hostile = WebhookPlugin::load(&rt, manifest("testdata/hostile-webhook")).unwrap();
    healthy_still_answers(&github).await;

    // Infinite loop in parse: stopped at its 300 ms deadline, not later,
    // and charged to the guest: it was spinning in its own code.
    let started = Instant::now();
    let spun = hostile.parse(&misbehave(b"loop")).await;
    assert_eq!(
        spun.as_ref().map_err(CallError::blame).err(),
        Some(Blame::Guest)
    );
    let fault = fault_of(spun);
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
    healthy_still_answers(&github).await;

    // Unbounded recursion exhausts the guest's own stack: reported as the
    // stack fault, not as the out-of-bounds access it looks like.
    assert_eq!(
        fault_of(hostile.parse(&misbehave(b"recurse")).await),
        Fault::StackOverflow
    );
    let report = hostile.health();
    assert_eq!(report.breaker, BreakerState::Closed, "{report:?}");
    assert_eq!(report.faults_in_window, 4);

    // A success between faults does not wipe the count: the fault after
    // it is the fifth in the window and opens the breaker.
    let parsed = hostile.parse(&misbehave(b"fine")).await.unwrap().unwrap();
    assert!(parsed.deliveries.is_empty());
    assert_eq!(hostile.health().consecutive_faults, 0);
    assert!(matches!(
        fault_of(hostile.verify(&misbehave(b"verify-loop")).await),
        Fault::Timeout { .. }
    ));
    let report = hostile.health();
    assert_eq!(report.breaker, BreakerState::Open, "{report:?}");
    assert!(report.degraded);
    assert_eq!(report.last_fault_kind, Some("timeout"));

    // Open: refused at once, without running.
    let calls = report.total_calls;
    let started = Instant::now();
    match hostile.parse(&misbehave(b"loop")).await {
        Err(CallError::Quarantined { retry_after, .. }) => {
            assert!(retry_after >= Duration::from_secs(1), "{retry_after:?}")
        }
        other => panic!("expected quarantine, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_millis(100));
    let report = hostile.health();
    assert_eq!((report.total_calls, report.refused_calls), (calls, 1));
    healthy_still_answers(&github).await;

    // After the open period one probe runs; its success closes the breaker
    // on a fresh instance (a re-entered trapped one would refuse it).
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(hostile.parse(&misbehave(b"fine")).await.unwrap().is_ok());
    let report = hostile.health();
    assert_eq!(report.breaker, BreakerState::Closed, "{report:?}");
    assert_eq!(report.total_faults, 5);
    assert!(github.health().total_faults == 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_probe_opens_the_breaker_for_longer() {
    let (rt, _data) = quick_breaker();
    let hostile = WebhookPlugin::load(&rt, manifest("testdata/hostile-webhook")).unwrap();
    for _ in 0..5 {
        fault_of(hostile.parse(&misbehave(b"panic")).await);
    }
    assert_eq!(hostile.health().breaker, BreakerState::Open);
    tokio::time::sleep(Duration::from_millis(250)).await;
    fault_of(hostile.parse(&misbehave(b"panic")).await);
    let report = hostile.health();
    assert_eq!(report.breaker, BreakerState::Open);
    assert!(
        report.retry_after.unwrap() > Duration::from_millis(250),
        "the second open period doubles: {report:?}"
    );
}

const HOSTILE_SECRET: &str = "hostile-secret-7f3a9c";

fn with_secret(what: &[u8]) -> Request {
    Request::new(
        "/webhooks/hostile",
        &[],
        what,
        &[("hostile_secret", HOSTILE_SECRET.as_bytes())],
        0,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_plugin_says_is_scrubbed_of_the_secrets_it_was_handed() {
    let (rt, _data) = runtime();
    let hostile = WebhookPlugin::load(&rt, manifest("testdata/hostile-webhook")).unwrap();
    let req = with_secret(b"panic-secret");
    let scrub = WebhookPlugin::scrub_for(&req);
    match fault_of(hostile.parse(&req).await) {
        Fault::Trap { reason } => {
            assert!(reason.contains("leaking [redacted]"), "{reason}");
            assert!(!reason.contains(HOSTILE_SECRET), "{reason}");
        }
        other => panic!("expected a trap, got {other:?}"),
    }
    let last = hostile.health().last_fault.unwrap();
    assert!(!last.contains(HOSTILE_SECRET), "{last}");

    let refusal = hostile
        .verify(&with_secret(b"verify-secret"))
        .await
        .unwrap()
        .unwrap_err();
    let sentence = refusal.sentence(&scrub);
    assert!(!sentence.contains(HOSTILE_SECRET), "{sentence}");
    assert!(sentence.starts_with("the header [redacted]"), "{sentence}");

    let parsed = hostile
        .parse(&with_secret(b"reply-secret"))
        .await
        .unwrap()
        .unwrap();
    let reply = parsed.reply.unwrap().scrubbed(&scrub).unwrap();
    let body = String::from_utf8(reply.body).unwrap();
    assert_eq!(body, "raw=[redacted] hex=[redacted]");
}

/// What a plugin says through `log` and on stderr, on calls that succeed:
/// scrubbed of the call's secrets and bounded; a flood of either (2,000
/// lines of 5 KiB, 1 MiB of stderr, on an instance reused call after call)
/// fails no call and keeps no more than the bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_speaks_scrubbed_and_bounded_and_a_flood_fails_nothing() {
    let (rt, _data) = runtime();
    // A deadline a loaded machine cannot miss: the flood is what is tested.
    let m = manifest_text(
        "testdata/hostile-webhook",
        "name = \"hostile-webhook\"\nversion = \"0.1.0\"\nkind = \"webhook\"\ncomponent = \"../../target/wasm32-wasip2/release/crewlet_test_hostile_webhook.wasm\"\n[limits]\nmemory_mib = 64\ndeadline_ms = 5000\n[webhook]\nroutes = [\"/webhooks/hostile\"]\nsecrets = [\"hostile_secret\"]\n",
    );
    let hostile = WebhookPlugin::load(&rt, m).unwrap();
    let t = hostile.trial(with_secret(b"speak-secret")).await.unwrap();
    assert_eq!(t.logged, ["raw=[redacted] hex=[redacted]"]);
    assert_eq!(t.said, "stderr raw=[redacted] hex=[redacted]");

    for _ in 0..3 {
        let parsed = hostile.parse(&misbehave(b"speak-flood")).await;
        assert!(
            matches!(parsed, Ok(Ok(_))),
            "a flood fails nothing: {parsed:?}"
        );
    }
    let t = hostile.trial(misbehave(b"speak-flood")).await.unwrap();
    assert_eq!(t.logged.len(), crewlet_plugins::voice::KEEP_LINES);
    assert!(
        t.logged
            .iter()
            .all(|l| l.len() <= crewlet_plugins::voice::MAX_LINE && l.ends_with("...")),
        "every line cut at the bound"
    );
    assert!(t.said.len() <= crewlet_plugins::scrub::MAX_PLUGIN_TEXT);
    assert!(t.said.starts_with("zzz"), "{}", t.said);
    assert_eq!(hostile.health().total_faults, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_parse_returns_is_held_to_the_hosts_bounds() {
    let (rt, _data) = runtime();
    // Real work (20,000 deliveries, one of 8 MiB) under a busy machine
    // must not meet the 300 ms the loop cases want.
    let mut m = manifest("testdata/hostile-webhook");
    m.limits.deadline = Duration::from_secs(5);
    let hostile = WebhookPlugin::load(&rt, m).unwrap();
    let bounds = |what: &'static [u8]| {
        let hostile = &hostile;
        async move {
            let parsed = hostile.parse(&misbehave(what)).await.unwrap().unwrap();
            check_bounds(&parsed)
        }
    };
    assert_eq!(bounds(b"one").await, Ok(()));
    assert_eq!(
        bounds(b"many").await,
        Err(Unbounded::TooMany { count: 20_000 })
    );
    assert!(matches!(
        bounds(b"huge").await,
        Err(Unbounded::TooLarge { index: 0, .. })
    ));
    assert_eq!(
        bounds(b"empty-id").await,
        Err(Unbounded::EmptyId { index: 0 })
    );
    assert_eq!(
        bounds(b"long-id").await,
        Err(Unbounded::LongId {
            index: 0,
            bytes: 5000
        })
    );

    // 12 texts aliasing one 8 MiB buffer would lift as 96 MiB (any count
    // multiplies it): each copy is weighed against the webhook world's
    // 64 MiB transfer bound before it is made.
    let limit = Kind::Webhook.ceiling().transfer_bytes() as u64;
    assert_eq!(
        fault_of(hostile.parse(&misbehave(b"alias")).await),
        Fault::Oversized { limit }
    );
    assert_eq!(bounds(b"one").await, Ok(()));
}

#[test]
fn a_manifest_past_the_hosts_ceiling_is_refused_naming_the_field() {
    let head = "name = \"greedy\"\nversion = \"0.1.0\"\nkind = \"webhook\"\ncomponent = \"x.wasm\"\n[webhook]\nroutes = [\"/webhooks/greedy\"]\n[limits]\n";
    let path = std::path::Path::new("plugins/greedy/plugin.toml");
    let deadline = Manifest::parse(path, &format!("{head}deadline_ms = 600000\n")).unwrap_err();
    assert_eq!(deadline.field, "limits.deadline_ms");
    assert!(
        deadline
            .to_string()
            .contains("ceiling for a webhook plugin (5000 ms"),
        "{deadline}"
    );
    let memory = Manifest::parse(path, &format!("{head}memory_mib = 1024\n")).unwrap_err();
    assert_eq!(memory.field, "limits.memory_mib");
    let busy = Manifest::parse(path, &format!("{head}concurrency = 64\n")).unwrap_err();
    assert_eq!(busy.field, "limits.concurrency");
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
    assert!(
        text.contains(
            "supports crewlet:plugin@0.4.2, crewlet:plugin@0.4.1 and crewlet:plugin@0.4.0"
        ),
        "{text}"
    );
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
        ..RuntimeConfig::default()
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
