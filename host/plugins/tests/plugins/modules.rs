//! Module grants end to end on a real nats-server (ADR 202): buckets
//! created from the catalogue, the owner writes, a reader reads and watches
//! (current values → marker → changes), a reader's write and every other
//! forbidden use is refused as a value the guest sees, and a healthy module
//! keeps answering.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{caller, manifest, manifest_text, nats_bus, plugins_dir, runtime};
use crewlet_plugins::catalogue::{BucketSpec, Catalogue};
use crewlet_plugins::grant::Grant;
use crewlet_plugins::module::{
    ModulePlugin, ModuleRefusal, WatchState, ensure_buckets, orphaned_buckets,
};
use crewlet_plugins::runtime::LoadError;
use crewlet_plugins::state::{KvState, StateBackend};
use crewlet_testkit::NatsServer;

async fn board_log(board: &ModulePlugin, want_lines: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = board
            .call_tool_json("log", "{}", &caller())
            .await
            .unwrap()
            .unwrap();
        let lines: Vec<String> = log.lines().map(str::to_string).collect();
        if lines.len() >= want_lines || Instant::now() > deadline {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn board(board: &ModulePlugin, tool: &str, key: &str) -> Result<String, String> {
    let arguments = serde_json::json!({ "key": key });
    board
        .call_tool(tool, &arguments, &caller())
        .await
        .unwrap()
        .map_err(|refused| refused.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_writes_reader_reads_and_watches_and_cannot_write() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let backend: Arc<dyn StateBackend> = Arc::new(KvState::nats(client.clone()));
    let (catalogue, invalid) = Catalogue::load(&plugins_dir()).unwrap();
    assert!(invalid.is_empty(), "{invalid:?}");
    let created = ensure_buckets(&catalogue, backend.as_ref()).await.unwrap();
    assert!(
        created.contains(&"mod_presence_seen".to_string()),
        "{created:?}"
    );
    // Idempotent: a second raise changes nothing and fails nothing.
    assert_eq!(
        ensure_buckets(&catalogue, backend.as_ref()).await.unwrap(),
        created
    );

    let (rt, _data) = runtime();
    let bus = nats_bus(&client);
    let owner = ModulePlugin::start(
        &rt,
        manifest("modules/presence"),
        &catalogue,
        backend.clone(),
        bus.clone(),
    )
    .await
    .unwrap();
    owner
        .on_event("seen.set", br#"{"who":"alice","where":"lab"}"#)
        .await
        .unwrap()
        .unwrap();
    let alice = backend.get("mod_presence_seen", "alice").await.unwrap();
    assert!(alice.is_some_and(|e| e.revision >= 1));
    assert!(
        owner.logs().iter().any(|l| l.contains("presence ready")),
        "{:?}",
        owner.logs()
    );

    // The reader starts after alice was written: she is current.
    let reader = ModulePlugin::start(
        &rt,
        manifest("modules/presence-board"),
        &catalogue,
        backend.clone(),
        bus.clone(),
    )
    .await
    .unwrap();
    assert_eq!(
        board_log(&reader, 2).await,
        vec![
            r#"current alice={"who":"alice","where":"lab"}"#.to_string(),
            "end-of-current".to_string(),
        ]
    );
    owner
        .on_event("seen.set", br#"{"who":"bob","where":"desk"}"#)
        .await
        .unwrap()
        .unwrap();
    owner
        .on_event("seen.delete", b"alice")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        board_log(&reader, 4).await[2..],
        [
            r#"put bob={"who":"bob","where":"desk"}"#.to_string(),
            "deleted alice".to_string(),
        ]
    );

    // Reads go through; a write is refused with the bucket and the reason.
    assert_eq!(
        board(&reader, "get", "bob").await.unwrap(),
        r#"{"who":"bob","where":"desk"}"#
    );
    assert_eq!(board(&reader, "get", "alice").await.unwrap(), "<none>");
    assert_eq!(
        reader
            .call_tool_json("keys", "{}", &caller())
            .await
            .unwrap(),
        Ok("bob".to_string())
    );
    let refused = board(&reader, "write", "mallory").await.unwrap_err();
    assert!(
        refused.starts_with("read-only: bucket `presence.seen`"),
        "{refused}"
    );
    assert_eq!(board(&reader, "get", "mallory").await.unwrap(), "<none>");

    // A second reader started now sees bob as current, then the marker.
    let late = ModulePlugin::start(
        &rt,
        manifest("modules/presence-board"),
        &catalogue,
        backend.clone(),
        bus,
    )
    .await
    .unwrap();
    let late_log = board_log(&late, 2).await;
    assert_eq!(
        late_log[..2],
        [
            r#"current bob={"who":"bob","where":"desk"}"#.to_string(),
            "end-of-current".to_string()
        ]
    );

    // A node that stops ends the instance, and its watches with it, before
    // its broker goes (a watch cut by that would read as a failure).
    assert_eq!(late.watches().len(), 1, "{:?}", late.watches());
    late.stop().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !late.watches().is_empty() {
        assert!(Instant::now() < deadline, "{:?}", late.watches());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_state_use_is_refused_as_values_while_a_healthy_module_answers() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let backend: Arc<dyn StateBackend> = Arc::new(KvState::nats(client.clone()));
    // The shipped catalogue plus the hostile module, as one deployment.
    let (mut catalogue, _) = Catalogue::load(&plugins_dir()).unwrap();
    let (hostile, _) = Catalogue::load(&plugins_dir().join("testdata")).unwrap();
    catalogue.plugins.extend(hostile.plugins);
    ensure_buckets(&catalogue, backend.as_ref()).await.unwrap();
    let (rt, _data) = runtime();
    let healthy = ModulePlugin::start(
        &rt,
        manifest("modules/presence"),
        &catalogue,
        backend.clone(),
        nats_bus(&client),
    )
    .await
    .unwrap();
    let hostile = ModulePlugin::start(
        &rt,
        manifest("testdata/hostile-module"),
        &catalogue,
        backend.clone(),
        nats_bus(&client),
    )
    .await
    .unwrap();

    let cases = [
        (
            "write-read-only",
            "refused: read-only: bucket `presence.seen`",
        ),
        (
            "undeclared-bucket",
            "refused: not-issued: bucket `payroll.salaries`",
        ),
        (
            "credential-field",
            "refused: credential-field: field `/server/headers/0/Authorization`",
        ),
        ("huge-value", "refused: value-too-large: 307202 bytes"),
    ];
    for (topic, expected) in cases {
        let answer = hostile
            .on_event(topic, b"")
            .await
            .expect("a refusal is not a fault");
        let refusal = answer.expect_err(topic);
        assert!(
            matches!(&refusal, ModuleRefusal::Refused(why) if why.starts_with(expected)),
            "{topic}: {refusal:?}"
        );
        healthy
            .on_event("seen.set", br#"{"who":"carol"}"#)
            .await
            .unwrap()
            .unwrap();
    }
    // Nothing was written by the refused calls; an ordinary write works.
    hostile.on_event("ordinary", b"").await.unwrap().unwrap();
    assert!(
        backend
            .get("mod_hostile-module_own", "fine")
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        backend
            .get("mod_presence_seen", "intruder")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        backend
            .get("mod_hostile-module_own", "huge")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        backend
            .get("mod_hostile-module_own", "mcp")
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        hostile.health().total_faults,
        0,
        "refusals are values, not faults"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_of_an_undeclared_bucket_is_refused_at_load_and_orphans_are_reported() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let backend: Arc<dyn StateBackend> = Arc::new(KvState::nats(client.clone()));
    let owner = manifest("modules/presence");
    let reader = manifest_text(
        "modules/presence-board",
        "name = \"nosy\"\nversion = \"0.1.0\"\nkind = \"module\"\ncomponent = \"../../target/wasm32-wasip2/release/crewlet_module_presence_board.wasm\"\n[module]\nreads = [\"presence.salaries\"]\n",
    );
    let catalogue = Catalogue {
        plugins: vec![owner, reader.clone()],
    };
    let problems = catalogue.problems();
    assert_eq!(problems.len(), 1);
    assert!(problems[0].to_string().contains("`presence.salaries` names a bucket module `presence` does not declare (it declares: seen)"), "{}", problems[0]);
    let (rt, _data) = runtime();
    let err = ModulePlugin::start(&rt, reader, &catalogue, backend.clone(), nats_bus(&client))
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, LoadError::Init { .. }), "{err:?}");

    // A bucket whose declaration left the catalogue is reported, not removed.
    let gone = BucketSpec {
        name: "mod_retired_notes".into(),
        owner: "retired".into(),
        local: "notes".into(),
        decl: None,
    };
    backend.ensure_bucket(&gone).await.unwrap();
    backend
        .put("mod_retired_notes", "k", b"v".to_vec())
        .await
        .unwrap();
    let orphans = orphaned_buckets(&catalogue, backend.as_ref())
        .await
        .unwrap();
    assert_eq!(orphans, vec!["mod_retired_notes".to_string()]);
    assert!(
        backend
            .get("mod_retired_notes", "k")
            .await
            .unwrap()
            .is_some()
    );
}

/// The operator denies the board the read its manifest declares: the
/// bucket is refused to it exactly as one it never declared (`not-issued`,
/// the value its `init` sees), while its owner writes as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_the_operator_denies_is_refused_like_an_undeclared_bucket() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let backend: Arc<dyn StateBackend> = Arc::new(KvState::nats(client.clone()));
    let (mut catalogue, _) = Catalogue::load(&plugins_dir()).unwrap();
    let deny = Grant {
        denied_reads: vec!["presence.seen".into()],
        ..Grant::default()
    };
    let grants = BTreeMap::from([("presence-board".to_string(), deny)]);
    catalogue.apply_grants(&grants, "node.toml").unwrap();
    ensure_buckets(&catalogue, backend.as_ref()).await.unwrap();
    let (rt, _data) = runtime();
    let owner = ModulePlugin::start(
        &rt,
        manifest("modules/presence"),
        &catalogue,
        backend.clone(),
        nats_bus(&client),
    )
    .await
    .unwrap();
    owner
        .on_event("seen.set", br#"{"who":"dora"}"#)
        .await
        .unwrap()
        .unwrap();

    let board = catalogue.get("presence-board").unwrap().clone();
    let refused = ModulePlugin::start(&rt, board, &catalogue, backend.clone(), nats_bus(&client))
        .await
        .err()
        .expect("its init's watch is refused");
    let text = refused.to_string();
    assert!(
        text.contains("not-issued") && text.contains("presence.seen"),
        "{text}"
    );
    // The host's answer names the operator's key that removed the read.
    assert!(
        text.contains("`plugins.grants.presence-board.denied_reads[0]` in node.toml"),
        "{text}"
    );
    // Without the deny the same manifest starts (the read is the only change).
    let (plain, _) = Catalogue::load(&plugins_dir()).unwrap();
    let board = plain.get("presence-board").unwrap().clone();
    ModulePlugin::start(&rt, board, &plain, backend, nats_bus(&client))
        .await
        .unwrap();
}

/// A bucket that does not answer reaches the module as `unavailable`
/// before the call's deadline, never as the deadline cutting the call:
/// the instance (and every watch it holds) outlives the outage, no fault
/// is counted, and the next write lands once the store is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_that_does_not_answer_is_unavailable_to_the_module_within_its_deadline() {
    let mut server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let backend: Arc<dyn StateBackend> = Arc::new(KvState::nats(client.clone()));
    let (catalogue, _) = Catalogue::load(&plugins_dir()).unwrap();
    ensure_buckets(&catalogue, backend.as_ref()).await.unwrap();
    let (rt, _data) = runtime();
    let presence = ModulePlugin::start(
        &rt,
        manifest("modules/presence"),
        &catalogue,
        backend.clone(),
        nats_bus(&client),
    )
    .await
    .unwrap();
    let deadline = presence.manifest().limits.deadline;

    server.kill();
    let started = Instant::now();
    let answer = presence
        .on_event("seen.set", br#"{"who":"carol","where":"away"}"#)
        .await
        .expect("the call is answered, not cut at its deadline");
    let took = started.elapsed();
    let refusal = answer.expect_err("the write cannot land while the store is down");
    assert!(
        matches!(&refusal, ModuleRefusal::Refused(why) if why.contains("unavailable")),
        "{refusal:?}"
    );
    assert!(took < deadline, "{took:?} against a {deadline:?} deadline");
    let health = presence.health();
    assert_eq!(
        (health.total_faults, health.host_faults),
        (0, 0),
        "{health:?}"
    );

    server.restart();
    let written = Instant::now() + Duration::from_secs(20);
    loop {
        let r = presence
            .on_event("seen.set", br#"{"who":"carol","where":"back"}"#)
            .await
            .unwrap();
        if r.is_ok() {
            break;
        }
        assert!(Instant::now() < written, "never written once back: {r:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ready = presence
        .logs()
        .iter()
        .filter(|l| l.contains("presence ready"))
        .count();
    assert_eq!(ready, 1, "one instance throughout: {:?}", presence.logs());
}

/// The keys of `bucket` with their values.
async fn bucket_entries(backend: &dyn StateBackend, bucket: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for key in backend.keys(bucket).await.unwrap() {
        if let Some(entry) = backend.get(bucket, &key).await.unwrap() {
            out.insert(key, String::from_utf8_lossy(&entry.value).into_owned());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_whose_watch_step_trapped_is_started_again_and_watches() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let backend: Arc<dyn StateBackend> = Arc::new(KvState::nats(client.clone()));
    let (catalogue, _) = Catalogue::load(&plugins_dir().join("testdata")).unwrap();
    ensure_buckets(&catalogue, backend.as_ref()).await.unwrap();
    let (rt, _data) = runtime();
    let relay = ModulePlugin::start(
        &rt,
        manifest("testdata/state-relay"),
        &catalogue,
        backend.clone(),
        nats_bus(&client),
    )
    .await
    .unwrap();
    let bucket = "mod_relay_seen";
    let hellos = |entries: &BTreeMap<String, String>| {
        entries
            .keys()
            .filter_map(|k| k.strip_prefix("hello.").map(str::to_string))
            .collect::<Vec<_>>()
    };
    let first = hellos(&bucket_entries(backend.as_ref(), bucket).await);
    assert_eq!(first.len(), 1, "one instance said hello: {first:?}");

    // Only the watch drives this module: nothing else will call it. The
    // trap is written once the watch is live: the module's `watch` returns
    // before its listing is taken, and a trap listed as current does not
    // fire.
    let live = Instant::now() + Duration::from_secs(10);
    while !matches!(relay.watches().as_slice(), [w] if w.state == WatchState::Live) {
        assert!(
            Instant::now() < live,
            "the watch never went live: {:?}",
            relay.watches()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    backend
        .put(bucket, "trap.once", b"x".to_vec())
        .await
        .unwrap();
    let started_again = Instant::now() + Duration::from_secs(15);
    let second = loop {
        let now = hellos(&bucket_entries(backend.as_ref(), bucket).await);
        if let Some(id) = now.iter().find(|id| !first.contains(id)) {
            break id.clone();
        }
        assert!(
            Instant::now() < started_again,
            "the instance the trap dropped was never started again: {:?}",
            relay.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(relay.health().total_faults, 1, "{:?}", relay.health());

    // The new instance's watch is live once it noted the first instance's
    // hello as current (its listing taken): a hello written after that is
    // seen as `put`.
    let listed = Instant::now() + Duration::from_secs(10);
    let noted = format!("saw.{second}.{}", first[0]);
    while !bucket_entries(backend.as_ref(), bucket)
        .await
        .contains_key(&noted)
    {
        assert!(
            Instant::now() < listed,
            "{noted} never written: {:?}",
            relay.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    backend
        .put(bucket, "hello.late", b"{}".to_vec())
        .await
        .unwrap();
    let seen = Instant::now() + Duration::from_secs(10);
    let key = format!("saw.{second}.late");
    loop {
        let entries = bucket_entries(backend.as_ref(), bucket).await;
        if let Some(how) = entries.get(&key) {
            assert_eq!(how, "put");
            break;
        }
        assert!(Instant::now() < seen, "{key} never written: {entries:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
