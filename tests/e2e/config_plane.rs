//! The config plane: `PUT /config` / `GET /config`, the reconciler on every
//! node, `crewlet config import` against a running and a stopped node, and
//! the pointer answering unknown.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use crewlet_coord::{Answer, Coord, CoordOptions, Owner};
use crewlet_os::ConfigEpoch;
use crewlet_testkit::{NatsServer, free_port};

const APPLY_WITHIN: Duration = Duration::from_secs(15);

fn example() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/company.toml"))
        .expect("examples/company.toml")
}

/// The example company under another org name: a different revision.
fn renamed(org: &str) -> String {
    example().replace("name = \"Acme Robotics\"", &format!("name = \"{org}\""))
}

fn node_with(sb: &Sandbox, stream: Option<&NatsServer>, id: &str, extra: &[&Path]) -> Node {
    node_with_roles(sb, stream, id, extra, None)
}

fn node_with_roles(
    sb: &Sandbox,
    stream: Option<&NatsServer>,
    id: &str,
    extra: &[&Path],
    roles: Option<&str>,
) -> Node {
    let port = free_port();
    let mut toml = format!("[node]\nid = \"{id}\"\n");
    if let Some(roles) = roles {
        toml.push_str(&format!("roles = {roles}\n"));
    }
    if let Some(server) = stream {
        toml.push_str(&format!("[stream]\nurl = \"{}\"\n", server.url()));
    }
    let cfg = sb.config(port, &toml);
    let mut builder = NodeBuilder::new(sb, port)
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(sb.data_dir());
    if let Some(company) = extra.first() {
        builder = builder.arg("--company").arg(company);
    }
    let mut node = builder.spawn();
    node.wait_ready(Duration::from_secs(60));
    node
}

fn put_config(node: &Node, doc: &str) -> http::Response {
    http::request(&node.api, "PUT", "/config", &[], doc.as_bytes()).expect("PUT /config answers")
}

fn applied(node: &Node) -> Option<u64> {
    node.health()["applied_epoch"].as_u64()
}

fn org_name(node: &Node) -> String {
    node.get("/org")
        .map(|r| r.json()["name"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

fn wait_applied(node: &Node, epoch: u64, org: &str) {
    assert!(
        eventually(APPLY_WITHIN, || applied(node) == Some(epoch)
            && org_name(node) == org),
        "node did not apply epoch {epoch} ({org}): health {}, log:\n{}",
        node.health(),
        node.log_text()
    );
}

#[test]
fn a_put_revision_is_applied_by_every_node_and_a_bad_one_is_refused() {
    let server = NatsServer::start();
    let (sb1, sb2) = (Sandbox::new(), Sandbox::new());
    let one = node_with(&sb1, Some(&server), "cfg-1", &[]);
    let mut two = node_with(&sb2, Some(&server), "cfg-2", &[]);
    assert_eq!(applied(&one), None, "nothing activated yet");
    let unset = one.get("/config").unwrap();
    assert_eq!(unset.status, 404, "{}", unset.text());

    // First revision, through node one.
    let first_doc = example();
    let put = put_config(&one, &first_doc);
    assert_eq!(put.status, 201, "{}", put.text());
    let first = put.json();
    let epoch1 = first["epoch"].as_u64().expect("an epoch");
    assert!(epoch1 >= 1);
    assert_eq!(first["digest"].as_str().unwrap().len(), 64);

    let got = one.get("/config").unwrap();
    assert_eq!(got.status, 200, "{}", got.text());
    let got = got.json();
    assert_eq!(got["epoch"], epoch1);
    assert_eq!(got["digest"], first["digest"]);
    assert_eq!(got["document"], first_doc.as_str());

    // Both nodes apply it: the reconciler, not the PUT, moved node two.
    wait_applied(&one, epoch1, "Acme Robotics");
    wait_applied(&two, epoch1, "Acme Robotics");
    // Told at once (the poll is the fallback): node one said it moved it.
    let told = format!("epoch={epoch1}");
    assert!(
        two.log_text().lines().any(|l| l
            .contains("a node moved the config pointer; polling it now")
            && l.contains(&told)),
        "{}",
        two.log_text()
    );
    let on_two = two.get("/config").unwrap().json();
    assert_eq!(on_two["epoch"], epoch1);
    assert_eq!(on_two["applied"], true, "{on_two}");

    // A bad document: 400 with every error and its path; nothing moves.
    let bad = example()
        .replace("Europe/Berlin", "Mars/Olympus")
        .replace("ada = { role = \"engineer\" }", "ada = { role = \"nope\" }")
        .replace("GITHUB_WEBHOOK_SECRET", "not a name");
    let refused = put_config(&two, &bad);
    assert_eq!(refused.status, 400, "{}", refused.text());
    let errors = refused.json()["errors"].as_array().cloned().unwrap();
    let paths: Vec<&str> = errors.iter().map(|e| e["path"].as_str().unwrap()).collect();
    for expected in [
        "org.timezone",
        "seats.ada.role",
        "integrations.github.secret",
    ] {
        assert!(paths.contains(&expected), "{expected} not in {paths:?}");
    }
    assert!(
        errors
            .iter()
            .all(|e| !e["message"].as_str().unwrap().is_empty())
    );
    assert_eq!(one.get("/config").unwrap().json()["epoch"], epoch1);

    // A second revision, through node two, gets a higher epoch.
    let put = put_config(&two, &renamed("Acme Two"));
    assert_eq!(put.status, 201, "{}", put.text());
    let epoch2 = put.json()["epoch"].as_u64().unwrap();
    assert!(epoch2 > epoch1, "{epoch2} > {epoch1}");
    wait_applied(&one, epoch2, "Acme Two");
    wait_applied(&two, epoch2, "Acme Two");

    // The same document again is already active: no new epoch.
    let again = put_config(&one, &renamed("Acme Two"));
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.json()["epoch"], epoch2);

    // Each node wrote its status with the epoch it applied.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(async_nats::connect(server.url())).unwrap();
    let coord = rt
        .block_on(Coord::open(
            client,
            CoordOptions::new(Owner::incarnation("observer")),
        ))
        .unwrap();
    for id in ["cfg-1", "cfg-2"] {
        match rt.block_on(coord.node_status(id)).expect("status answers") {
            Answer::Yes(status) => assert_eq!(status["applied_epoch"], epoch2, "{id}: {status}"),
            Answer::No(()) => panic!("{id} wrote no status"),
        }
    }

    // And recorded it in its own store.
    two.signal(libc::SIGTERM);
    assert_eq!(two.wait_exit(Duration::from_secs(30)).code(), Some(0));
    let store = crewlet_store::Store::open_in(&sb2.data_dir()).unwrap();
    let active = store
        .active_revision()
        .unwrap()
        .expect("an active revision");
    assert_eq!(active.revision, epoch2 as i64);
    assert!(active.document.contains("Acme Two"));
}

fn write(sb: &Sandbox, name: &str, doc: &str) -> PathBuf {
    let p = sb.path(name);
    std::fs::write(&p, doc).unwrap();
    p
}

#[test]
fn config_import_goes_through_a_running_node_and_into_a_stopped_ones_store() {
    let sb = Sandbox::new();
    let seed = write(&sb, "seed.toml", &example());
    let mut node = node_with(&sb, None, "import-1", &[&seed]);
    // --company on an unset pointer seeds the fleet with it.
    let seeded = applied(&node).expect("the --company document was activated");
    assert!(seeded >= 1);
    assert_eq!(org_name(&node), "Acme Robotics");

    let api = format!("http://{}", node.api);
    let b = write(&sb, "b.toml", &renamed("Acme Bee"));
    let (status, out) = run_to_exit(
        &["config", "import", b.to_str().unwrap(), "--api", &api],
        &[],
    );
    assert!(status.success(), "{out}");
    assert!(out.contains("epoch"), "{out}");
    // It answers once the fleet (this one node) applied the revision.
    assert!(out.contains("applied by 1 node (import-1)"), "{out}");
    let epoch_b = node.get("/config").unwrap().json()["epoch"]
        .as_u64()
        .unwrap();
    assert!(epoch_b > seeded);
    wait_applied(&node, epoch_b, "Acme Bee");

    // --data-dir of a running node: the lock is held, so it goes through the API.
    let c = write(&sb, "c.toml", &renamed("Acme Sea"));
    let data = sb.data_dir();
    let (status, out) = run_to_exit(
        &[
            "config",
            "import",
            c.to_str().unwrap(),
            "--api",
            &api,
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
    );
    assert!(status.success(), "{out}");
    let epoch_c = node.get("/config").unwrap().json()["epoch"]
        .as_u64()
        .unwrap();
    assert!(epoch_c > epoch_b);
    wait_applied(&node, epoch_c, "Acme Sea");

    // A refused document exits 2 and names its paths.
    let bad = write(
        &sb,
        "bad.toml",
        &example().replace("Europe/Berlin", "Mars/Olympus"),
    );
    let (status, out) = run_to_exit(
        &["config", "import", bad.to_str().unwrap(), "--api", &api],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(out.contains("org.timezone"), "{out}");

    // Stopped: the import marks the revision active in the node store...
    node.signal(libc::SIGTERM);
    assert_eq!(node.wait_exit(Duration::from_secs(30)).code(), Some(0));
    let d = write(&sb, "d.toml", &renamed("Acme Dee"));
    let (status, out) = run_to_exit(
        &[
            "config",
            "import",
            d.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
            "--api",
            "http://127.0.0.1:9",
        ],
        &[],
    );
    assert!(status.success(), "{out}");
    assert!(out.contains("no node is running"), "{out}");
    {
        let store = crewlet_store::Store::open_in(&data).unwrap();
        let active = store.active_revision().unwrap().unwrap();
        assert!(active.is_pending(), "{active:?}");
        assert!(active.document.contains("Acme Dee"));
    }

    // ...and the next start activates it through the pointer (over the
    // --company document, which only seeds an unset pointer).
    let node = node_with(&sb, None, "import-1", &[&seed]);
    let got = node.get("/config").unwrap().json();
    let epoch_d = got["epoch"].as_u64().unwrap();
    assert!(epoch_d > epoch_c, "{got}");
    assert!(got["document"].as_str().unwrap().contains("Acme Dee"));
    wait_applied(&node, epoch_d, "Acme Dee");
}

#[test]
fn an_unreachable_pointer_answers_503_and_keeps_the_company() {
    let mut server = NatsServer::start();
    let sb = Sandbox::new();
    let node = node_with(&sb, Some(&server), "down-1", &[]);
    let put = put_config(&node, &example());
    assert_eq!(put.status, 201, "{}", put.text());
    let epoch = put.json()["epoch"].as_u64().unwrap();
    wait_applied(&node, epoch, "Acme Robotics");

    server.kill();
    let refused = put_config(&node, &renamed("Never"));
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(
        refused.header("retry-after").is_some(),
        "Retry-After is set"
    );
    let read = node.get("/config").unwrap();
    assert_eq!(read.status, 503, "{}", read.text());
    assert!(read.header("retry-after").is_some());

    // Unknown is not unset: the node keeps serving what it applied, and
    // says it is isolated.
    wait_posture(&node, "isolated", APPLY_WITHIN);
    assert_eq!(applied(&node), Some(epoch));
    assert_eq!(org_name(&node), "Acme Robotics");
}

fn posture(node: &Node) -> String {
    node.health()["posture"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn ready_status(node: &Node) -> u16 {
    node.get("/ready").map(|r| r.status).unwrap_or(0)
}

fn wait_posture(node: &Node, want: &str, within: Duration) {
    assert!(
        eventually(within, || posture(node) == want),
        "posture never {want}: health {}, log:\n{}",
        node.health(),
        node.log_text()
    );
}

#[test]
fn postures_serve_wait_stuck_and_back_to_serve() {
    use crewlet_coord::Bucket;
    let server = NatsServer::start();
    let sb = Sandbox::new();
    let node = node_with(&sb, Some(&server), "posture-1", &[]);
    // Nothing activated: serve.
    assert_eq!(posture(&node), "serve", "{}", node.health());
    assert_eq!(ready_status(&node), 200);

    let a = put_config(&node, &example());
    assert_eq!(a.status, 201, "{}", a.text());
    let epoch_a = a.json()["epoch"].as_u64().unwrap();
    wait_applied(&node, epoch_a, "Acme Robotics");
    wait_posture(&node, "serve", APPLY_WITHIN);
    let b = put_config(&node, &renamed("Acme Bee"));
    let (epoch_b, digest_b) = (
        b.json()["epoch"].as_u64().unwrap(),
        b.json()["digest"].as_str().unwrap().to_owned(),
    );
    wait_applied(&node, epoch_b, "Acme Bee");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(async_nats::connect(server.url())).unwrap();
    let coord = rt
        .block_on(Coord::open(
            client,
            CoordOptions::new(Owner::incarnation("operator")),
        ))
        .unwrap();

    // wait → serve: the pointer moves to a revision whose document is not
    // in the bucket (yet). The node is behind, waits, and stays ready.
    let Answer::Yes((record_b, _)) = rt
        .block_on(coord.get_record(Bucket::Config, "company_revision", &digest_b))
        .unwrap()
    else {
        panic!("revision b is stored");
    };
    assert!(matches!(
        rt.block_on(coord.remove_record(Bucket::Config, "company_revision", &digest_b)),
        Ok(Answer::Yes(()))
    ));
    let Answer::Yes(epoch_c) = rt
        .block_on(coord.activate(&digest_b, Some(ConfigEpoch(epoch_b))))
        .unwrap()
    else {
        panic!("the pointer moves");
    };
    wait_posture(&node, "wait", APPLY_WITHIN);
    let health = node.health();
    assert_eq!(health["pointer_epoch"], epoch_c.get(), "{health}");
    assert_eq!(
        health["applied_epoch"], epoch_b,
        "keeps serving b: {health}"
    );
    let ready = node.get("/ready").unwrap();
    assert_eq!(ready.status, 200, "wait stays ready: {}", ready.text());
    assert_eq!(ready.json()["state"], "wait", "{}", ready.text());
    rt.block_on(coord.put_record(Bucket::Config, "company_revision", &digest_b, &record_b))
        .unwrap();
    wait_applied(&node, epoch_c.get(), "Acme Bee");
    wait_posture(&node, "serve", APPLY_WITHIN);

    // stuck: the pointer names a document this build refuses; after the
    // reconciler's bound (10 s) the node is stuck — /ready 503, /health 200.
    let bogus = "f".repeat(64);
    let record = serde_json::json!({
        "digest": bogus,
        "document": "this is [not a company",
        "source": "a test",
    });
    rt.block_on(coord.put_record(Bucket::Config, "company_revision", &bogus, &record))
        .unwrap();
    let Answer::Yes(epoch_d) = rt.block_on(coord.activate(&bogus, Some(epoch_c))).unwrap() else {
        panic!("the pointer moves");
    };
    wait_posture(&node, "wait", APPLY_WITHIN);
    assert_eq!(ready_status(&node), 200);
    wait_posture(&node, "stuck", Duration::from_secs(30));
    let ready = node.get("/ready").unwrap();
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert_eq!(ready.json()["reason"], "stuck", "{}", ready.text());
    let health = node.get("/health").unwrap();
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["pointer_epoch"], epoch_d.get());
    assert_eq!(
        health.json()["applied_epoch"],
        epoch_c.get(),
        "still serving c"
    );
    assert_eq!(org_name(&node), "Acme Bee");
    // The status it writes for the fleet says so too.
    assert!(eventually(APPLY_WITHIN, || {
        matches!(rt.block_on(coord.node_status("posture-1")),
            Ok(Answer::Yes(s)) if s["posture"] == "stuck" && s["failed_epoch"] == epoch_d.get())
    }));

    // A good revision activated over it: serve and ready again.
    let fixed = put_config(&node, &renamed("Acme Fixed"));
    assert_eq!(fixed.status, 201, "{}", fixed.text());
    let epoch_e = fixed.json()["epoch"].as_u64().unwrap();
    wait_applied(&node, epoch_e, "Acme Fixed");
    wait_posture(&node, "serve", APPLY_WITHIN);
    assert!(eventually(APPLY_WITHIN, || ready_status(&node) == 200));
}

#[test]
fn a_node_behind_while_a_peer_serves_the_epoch_sheds_and_takes_no_triggers() {
    use crewlet_coord::Bucket;
    let server = NatsServer::start();
    let sb = Sandbox::new();
    // No `seats` role: the test reads ada's mailbox itself, as her seat would.
    let node = node_with_roles(
        &sb,
        Some(&server),
        "shed-1",
        &[],
        Some(r#"["data", "ingress", "workers"]"#),
    );
    let a = put_config(&node, &example());
    assert_eq!(a.status, 201, "{}", a.text());
    let epoch_a = a.json()["epoch"].as_u64().unwrap();
    wait_applied(&node, epoch_a, "Acme Robotics");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(async_nats::connect(server.url())).unwrap();
    let coord = rt
        .block_on(Coord::open(
            client.clone(),
            CoordOptions::new(Owner::incarnation("operator")),
        ))
        .unwrap();

    // The pointer names a document this node refuses, and a peer reports
    // serving that epoch: after the grace the node sheds.
    let bogus = "e".repeat(64);
    let record = serde_json::json!({ "digest": bogus, "document": "[not a company" });
    rt.block_on(coord.put_record(Bucket::Config, "company_revision", &bogus, &record))
        .unwrap();
    let Answer::Yes(epoch_b) = rt
        .block_on(coord.activate(&bogus, Some(ConfigEpoch(epoch_a))))
        .unwrap()
    else {
        panic!("the pointer moves");
    };
    rt.block_on(coord.publish_status(
        "peer-ahead",
        &serde_json::json!({ "applied_epoch": epoch_b, "posture": "serve" }),
    ))
    .unwrap();
    wait_posture(&node, "shed", Duration::from_secs(30));
    let ready = node.get("/ready").unwrap();
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert_eq!(ready.json()["reason"], "shed");
    assert_eq!(node.get("/health").unwrap().status, 200);
    assert_eq!(org_name(&node), "Acme Robotics", "serves what it applied");

    // A delivery arriving now is not worked here.
    let inbound = crewlet_bus::Inbound {
        trace_id: "t-shed".into(),
        key: "test:shed-1".into(),
        delivery_id: "shed-1".into(),
        source: "test".into(),
        event_type: "comment".into(),
        route_handle: None,
        mentions: vec!["@ada".into()],
        assignees: vec![],
        reviewers: vec![],
        channel: None,
        thread: None,
        text: Some("while shedding".into()),
        owed: None,
        sender: Vec::new(),
        wakes: Default::default(),
        message: None,
        received_by: "operator".into(),
        received_at_ms: 0,
    };
    rt.block_on(async {
        let js = async_nats::jetstream::new(client.clone());
        js.publish(
            crewlet_bus::INBOUND_SUBJECT,
            serde_json::to_vec(&inbound).unwrap().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    });
    // Absence over a window: three seconds is many polls' worth of a
    // consuming node (it wakes within milliseconds when it consumes).
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        rt.block_on(take_wake(&client, "ada")),
        None,
        "worked while shedding"
    );

    // A revision it can apply: it serves and works the delivery.
    let fixed = put_config(&node, &renamed("Acme Fixed"));
    let epoch_c = fixed.json()["epoch"].as_u64().unwrap();
    wait_applied(&node, epoch_c, "Acme Fixed");
    wait_posture(&node, "serve", APPLY_WITHIN);
    let mut woke = None;
    // Up to the consumer's ack wait (30 s): a pull the shedding node had
    // outstanding may have taken it without handing it over.
    assert!(
        eventually(Duration::from_secs(45), || {
            woke = rt.block_on(take_wake(&client, "ada"));
            woke.is_some()
        }),
        "{}",
        node.log_text()
    );
    assert_eq!(woke.unwrap()["delivery_id"], "shed-1");
}

/// `crewlet config import` waits for the fleet: it says "applied" only
/// once every node's status names the new epoch. A node that cannot apply
/// it (frozen with SIGSTOP) keeps the import waiting; after `--wait` it
/// exits 1 naming that node and where it stands, while the revision stays
/// active — and that node applies it once it runs again.
#[test]
fn config_import_waits_for_every_node_and_names_the_one_behind() {
    let server = NatsServer::start();
    let (sb1, sb2) = (Sandbox::new(), Sandbox::new());
    let one = node_with(&sb1, Some(&server), "cfg-wait-1", &[]);
    let two = node_with(&sb2, Some(&server), "cfg-wait-2", &[]);

    let api = format!("http://{}", one.api);
    let both = write(&sb1, "both.toml", &example());
    let (status, out) = run_to_exit(
        &["config", "import", both.to_str().unwrap(), "--api", &api],
        &[],
    );
    assert!(status.success(), "{out}");
    assert!(
        out.contains("applied by 2 nodes (cfg-wait-1, cfg-wait-2)"),
        "{out}"
    );
    let first = one.get("/config").unwrap().json()["epoch"]
        .as_u64()
        .unwrap();

    two.freeze();
    let next = write(&sb1, "next.toml", &renamed("Acme Wait"));
    let (status, out) = run_to_exit(
        &[
            "config",
            "import",
            next.to_str().unwrap(),
            "--api",
            &api,
            "--wait",
            "4",
        ],
        &[],
    );
    two.signal(libc::SIGCONT);
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(out.contains("1 of 2 nodes applied it"), "{out}");
    assert!(
        out.contains(&format!("cfg-wait-2 is at epoch {first}")),
        "{out}"
    );
    let active = one.get("/config").unwrap().json();
    let second = active["epoch"].as_u64().unwrap();
    assert!(second > first, "the revision is active: {active}");
    wait_applied(&two, second, "Acme Wait");
}
