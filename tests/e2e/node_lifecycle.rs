//! The node's lifecycle, end to end: the real binary, a real nats-server.

use crate::common;

use std::time::Duration;

use common::*;
use crewlet_testkit::{NatsServer, free_port};

const READY_WITHIN: Duration = Duration::from_secs(30);

#[test]
fn empty_data_dir_becomes_ready_with_an_embedded_jetstream_under_it() {
    let sb = Sandbox::new();
    let mut node = sb.node("").spawn();
    node.wait_ready(READY_WITHIN);

    let health = node.health();
    assert_eq!(health["phase"], "running", "{health}");
    assert_eq!(health["stream"]["mode"], "embedded", "{health}");
    assert_eq!(health["stream"]["connected"], true, "{health}");
    assert_eq!(health["stream"]["server"]["sync"], "always", "{health}");

    let broker = node.broker_pid();
    assert!(alive(broker));
    assert!(
        cmdline(broker).contains("nats-server"),
        "{}",
        cmdline(broker)
    );
    assert_eq!(children(node.pid()), vec![broker]);

    let store = sb.data_dir().join("stream");
    let conf = std::fs::read_to_string(store.join("nats-server.conf")).unwrap();
    assert!(conf.contains("sync_interval: always"), "{conf}");
    assert!(conf.contains("jetstream"), "{conf}");
    assert!(
        store.join("jetstream").is_dir(),
        "JetStream keeps its store under the data dir"
    );
    assert!(sb.data_dir().join("node-id").is_file());
    assert!(sb.data_dir().join("node.sqlite3").is_file());
    assert_eq!(
        health["store"]["schema_version"],
        crewlet_store::MIGRATIONS.len()
    );

    // The streams exist on the embedded broker, with their retentions.
    let url = health["stream"]["urls"][0].as_str().unwrap().to_owned();
    let login = broker_login(&health);
    let streams = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async move {
            let js = async_nats::jetstream::new(login.connect(url).await.unwrap());
            let mut found = Vec::new();
            for name in [
                "CREWLET_AGENT",
                "CREWLET_NOTIFICATIONS",
                "CREWLET_EVENTS",
                "CREWLET_DLQ",
                "CREWLET_MEMORY",
            ] {
                let info = js.get_stream(name).await.unwrap().cached_info().clone();
                found.push((name, format!("{:?}", info.config.retention)));
            }
            found
        });
    assert_eq!(
        streams,
        [
            ("CREWLET_AGENT", "Interest".to_owned()),
            ("CREWLET_NOTIFICATIONS", "Interest".to_owned()),
            ("CREWLET_EVENTS", "Limits".to_owned()),
            ("CREWLET_DLQ", "Limits".to_owned()),
            ("CREWLET_MEMORY", "Limits".to_owned()),
        ]
    );
    assert_eq!(
        health["node_id"].as_str().unwrap(),
        std::fs::read_to_string(sb.data_dir().join("node-id"))
            .unwrap()
            .trim()
    );
}

#[test]
fn sigterm_drains_with_ready_503_then_exits_zero_and_stops_the_child() {
    let sb = Sandbox::new();
    let mut node = sb.node("[shutdown]\ndrain_notice_seconds = 3\n").spawn();
    node.wait_ready(READY_WITHIN);
    let broker = node.broker_pid();

    node.signal(libc::SIGTERM);
    // From the first instant of the drain: not ready, still healthy, and
    // new work refused with 503 + Retry-After.
    assert!(
        eventually(Duration::from_millis(500), || node
            .get("/ready")
            .is_some_and(|r| r.status == 503)),
        "/ready did not turn 503 during the drain"
    );
    let ready = node.get("/ready").expect("probe answers while draining");
    assert_eq!(ready.status, 503);
    assert_eq!(ready.json()["reason"], "draining");
    let health = node.get("/health").expect("health answers while draining");
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["draining"], true);
    assert_eq!(
        health.json()["posture"],
        "serve",
        "the posture stays visible"
    );
    let work = http::post(&node.api, "/webhooks/github", &[], b"{}").unwrap();
    assert_eq!(work.status, 503);
    assert_eq!(work.header("retry-after"), Some("5"));
    assert!(alive(broker), "the broker outlives the drain notice");

    let status = node.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "log:\n{}", node.log_text());
    assert!(!alive(broker), "nats-server child still running");
    let log = node.log_text();
    let http_closed = log.find("HTTP surface closed").expect("HTTP closed logged");
    let broker_stopped = log
        .find("embedded nats-server stopped")
        .expect("broker stop logged");
    assert!(
        http_closed < broker_stopped,
        "the broker stops last:\n{log}"
    );
}

#[test]
fn sigkill_of_the_node_takes_the_child_down_within_two_seconds() {
    let sb = Sandbox::new();
    let mut node = sb.node("").spawn();
    node.wait_ready(READY_WITHIN);
    let broker = node.broker_pid();
    assert!(alive(broker));

    node.signal(libc::SIGKILL);
    node.wait_exit(Duration::from_secs(5));
    assert!(
        eventually(Duration::from_secs(2), || !alive(broker)),
        "nats-server {broker} survived its node"
    );
}

#[test]
fn a_child_killed_behind_the_nodes_back_is_restarted_and_ready_recovers() {
    let sb = Sandbox::new();
    let mut node = sb.node("").spawn();
    node.wait_ready(READY_WITHIN);
    let first = node.broker_pid();

    // SAFETY: a process we found as the node's child; a test-only kill.
    unsafe {
        libc::kill(first, libc::SIGKILL);
    }
    // The outage is shorter than the heartbeat (15 s): the node stays in
    // rotation through it, saying it is disconnected; any 503 would have
    // to be a longer outage than the bound.
    let mut saw_disconnected = false;
    let recovered = eventually(Duration::from_secs(20), || {
        let Some(ready) = node.get("/ready") else {
            return false;
        };
        let body = ready.json();
        if ready.status == 200 {
            saw_disconnected |= body["state"] == "disconnected";
        } else {
            assert_eq!(body["reason"], "stream_disconnected", "{body}");
            assert!(
                body["down_ms"].as_u64() >= body["steps_out_after_ms"].as_u64(),
                "503 within the bound: {body}"
            );
        }
        let health = node.health();
        ready.status == 200
            && body["state"] == "serving"
            && health["stream"]["server"]["restarts"].as_u64() >= Some(1)
            && health["stream"]["server"]["pid"]
                .as_i64()
                .is_some_and(|p| p as i32 != first)
    });
    assert!(
        recovered,
        "not recovered: {}\nlog:\n{}",
        node.health(),
        node.log_text()
    );
    assert!(
        saw_disconnected,
        "/ready should say the stream is down while it is"
    );
    let second = node.broker_pid();
    assert!(alive(second));
    assert_eq!(children(node.pid()), vec![second]);
    assert!(node.log_text().contains("nats-server exited unexpectedly"));
}

#[test]
fn bad_configs_exit_2_naming_file_and_key_and_touch_nothing() {
    let cases = [
        ("[stream]\nreplica = 1\n", "stream.replica", "unknown field"),
        (
            "[coordination]\nlease_ttl_seconds = \"long\"\n",
            "coordination.lease_ttl_seconds",
            "expected u64",
        ),
        (
            "[stream]\nurl = \"nats://${CREWLET_TEST_SURELY_UNSET}:4222\"\n",
            "stream.url",
            "CREWLET_TEST_SURELY_UNSET",
        ),
    ];
    for (body, key, expected) in cases {
        let sb = Sandbox::new();
        let file = sb.path("node.toml");
        std::fs::write(&file, body).unwrap();
        let data = sb.data_dir();
        let (status, out) = run_to_exit(
            &[
                "run",
                "--config",
                file.to_str().unwrap(),
                "--data-dir",
                data.to_str().unwrap(),
            ],
            &[],
        );
        assert_eq!(status.code(), Some(2), "{body}: {out}");
        assert!(
            out.contains(file.to_str().unwrap()),
            "names the file: {out}"
        );
        assert!(
            out.contains(&format!("`{key}`")),
            "names the key {key}: {out}"
        );
        assert!(out.contains(expected), "says what was expected: {out}");
        assert!(!data.exists(), "data dir created by a refused config");
        let entries: Vec<_> = std::fs::read_dir(sb.dir.path())
            .unwrap()
            .flatten()
            .collect();
        assert_eq!(entries.len(), 1, "only node.toml is in the sandbox");
    }
}

#[test]
fn no_nats_server_anywhere_is_a_clear_error_naming_the_fix() {
    let sb = Sandbox::new();
    let empty_tools = sb.path("no-tools");
    std::fs::create_dir_all(&empty_tools).unwrap();
    let mut node = sb
        .node("")
        .env("CREWLET_TOOLS_DIR", &empty_tools)
        .env_remove("CREWLET_NATS_SERVER")
        .env("PATH", "/usr/bin:/bin")
        .spawn();
    let status = node.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(1));
    let log = node.log_text();
    assert!(log.contains("no nats-server binary found"), "{log}");
    assert!(log.contains("scripts/bootstrap.sh"), "{log}");
    assert!(log.contains("CREWLET_NATS_SERVER"), "{log}");
}

#[test]
fn a_second_node_on_the_same_data_dir_refuses_to_start() {
    let sb = Sandbox::new();
    let mut first = sb.node("").spawn();
    first.wait_ready(READY_WITHIN);

    let sb2 = Sandbox::new();
    let port2 = free_port();
    let cfg2 = sb2.config(port2, "");
    let mut second = NodeBuilder::new(&sb2, port2)
        .arg("--config")
        .arg(&cfg2)
        .arg("--data-dir")
        .arg(sb.data_dir())
        .spawn();
    assert_eq!(second.wait_exit(Duration::from_secs(20)).code(), Some(1));
    let log = second.log_text();
    assert!(log.contains("is in use by another process"), "{log}");
    assert_eq!(children(first.pid()).len(), 1, "still exactly one broker");
    assert_eq!(first.get("/ready").map(|r| r.status), Some(200));
}

#[test]
fn a_second_node_on_the_same_stream_store_refuses_to_start() {
    let sb = Sandbox::new();
    let store = sb.path("shared-store");
    let extra = format!("[stream]\nstore_dir = {:?}\n", store.display().to_string());
    let port = free_port();
    let cfg = sb.config(port, &extra);
    let mut first = NodeBuilder::new(&sb, port)
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(sb.path("data-a"))
        .spawn();
    first.wait_ready(READY_WITHIN);

    let sb2 = Sandbox::new();
    let port2 = free_port();
    let cfg2 = sb2.config(port2, &extra);
    let mut second = NodeBuilder::new(&sb2, port2)
        .arg("--config")
        .arg(&cfg2)
        .arg("--data-dir")
        .arg(sb2.path("data-b"))
        .spawn();
    assert_eq!(second.wait_exit(Duration::from_secs(20)).code(), Some(1));
    let log = second.log_text();
    assert!(log.contains("stream store dir"), "{log}");
    assert!(log.contains("in use"), "{log}");
}

#[test]
fn external_mode_uses_the_given_server_and_starts_no_child() {
    let server = NatsServer::start();
    let sb = Sandbox::new();
    let mut node = sb
        .node(&format!("[stream]\nurl = \"{}\"\n", server.url()))
        .spawn();
    node.wait_ready(READY_WITHIN);
    let health = node.health();
    assert_eq!(health["stream"]["mode"], "external", "{health}");
    assert_eq!(health["stream"]["urls"][0], server.url(), "{health}");
    assert!(health["stream"]["server"].is_null(), "{health}");
    assert!(children(node.pid()).is_empty(), "no child in external mode");
    assert!(!sb.data_dir().join("stream").exists());

    node.signal(libc::SIGTERM);
    assert_eq!(node.wait_exit(Duration::from_secs(20)).code(), Some(0));
}

#[test]
fn version_and_help_answer() {
    let (status, out) = run_to_exit(&["version"], &[]);
    assert!(status.success());
    assert!(out.starts_with("crewlet "), "{out}");
    let (status, out) = run_to_exit(&["--help"], &[]);
    assert!(status.success());
    assert!(
        out.contains("run") && out.contains("company of AI agents"),
        "{out}"
    );
    let (status, out) = run_to_exit(&["run", "--help"], &[]);
    assert!(status.success());
    for flag in ["--config", "--company", "--plugins", "--data-dir"] {
        assert!(out.contains(flag), "{flag} in {out}");
    }
}

#[test]
fn json_logs_carry_node_id_and_subsystem_on_every_line() {
    let sb = Sandbox::new();
    let mut node = sb
        .node("[node]\nid = \"json-node\"\n")
        .arg("--log-format")
        .arg("json")
        .spawn();
    node.wait_ready(READY_WITHIN);
    node.signal(libc::SIGTERM);
    assert_eq!(node.wait_exit(Duration::from_secs(20)).code(), Some(0));

    let log = node.log_text();
    let mut subsystems = std::collections::BTreeSet::new();
    for line in log.lines() {
        let event: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        let subsystem = event["subsystem"]
            .as_str()
            .unwrap_or_else(|| panic!("no subsystem: {line}"));
        subsystems.insert(subsystem.to_owned());
        let in_node_span = event["spans"]
            .as_array()
            .is_some_and(|spans| spans.iter().any(|s| s["node_id"] == "json-node"));
        assert!(
            in_node_span || event["node_id"] == "json-node",
            "no node id: {line}"
        );
    }
    for expected in ["node", "api", "broker", "stream"] {
        assert!(
            subsystems.contains(expected),
            "{expected} missing from {subsystems:?}"
        );
    }
}

#[test]
fn a_store_written_by_a_newer_schema_stops_the_node() {
    use crewlet_store::{FILE_NAME, MIGRATIONS, Migration, Store};
    let sb = Sandbox::new();
    std::fs::create_dir_all(sb.data_dir()).unwrap();
    let future: Vec<Migration> = MIGRATIONS
        .iter()
        .copied()
        .chain([Migration {
            version: MIGRATIONS.len() as u32 + 1,
            name: "from_a_newer_build",
            sql: "CREATE TABLE newer (x INTEGER)",
        }])
        .collect();
    drop(Store::open_with(&sb.data_dir().join(FILE_NAME), &future).unwrap());

    let mut node = sb.node("").spawn();
    assert_eq!(node.wait_exit(Duration::from_secs(20)).code(), Some(1));
    let log = node.log_text();
    assert!(log.contains("written by a newer crewlet"), "{log}");
    assert!(
        !sb.data_dir().join("stream").exists(),
        "no broker was started"
    );
}

fn example_company() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/company.toml")
}

#[test]
fn a_node_without_the_ingress_role_serves_only_its_probes() {
    let sb = Sandbox::new();
    let mut node = sb
        .node("[node]\nroles = [\"data\", \"seats\", \"workers\"]\n")
        .arg("--company")
        .arg(example_company())
        .spawn();
    node.wait_ready(READY_WITHIN);
    assert_eq!(node.get("/health").unwrap().status, 200);
    for path in ["/org", "/plugins", "/events", "/webhooks/github", "/"] {
        let r = node.get(path).unwrap();
        assert_eq!(r.status, 404, "{path}: {}", r.text());
        assert!(
            r.text().contains("no `ingress` role"),
            "{path}: {}",
            r.text()
        );
    }
}

#[test]
fn the_example_company_is_served_at_org() {
    let sb = Sandbox::new();
    let mut node = sb.node("").arg("--company").arg(example_company()).spawn();
    node.wait_ready(READY_WITHIN);
    let org = node.get("/org").unwrap();
    assert_eq!(org.status, 200);
    let org = org.json();
    assert_eq!(org["name"], "Acme Robotics");
    let seats = org["seats"].as_array().unwrap();
    assert!(seats.len() >= 2, "{org}");
    for seat in seats {
        let id = seat["id"].as_str().unwrap();
        assert_eq!(id.len(), 36, "{seat}");
        assert_eq!(&id[14..15], "5", "a UUIDv5: {seat}");
    }
    assert_eq!(node.health()["company"]["org"], "Acme Robotics");
}

#[test]
fn an_invalid_company_exits_2_with_every_error_and_its_path() {
    let sb = Sandbox::new();
    let doc = sb.path("company.toml");
    std::fs::write(
        &doc,
        "[org]\nname = \"A\"\ntimezone = \"Nowhere/Else\"\n[seats]\nada = { role = \"ghost\" }\n",
    )
    .unwrap();
    let data = sb.data_dir();
    let (status, out) = run_to_exit(
        &[
            "run",
            "--company",
            doc.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(out.contains("2 errors"), "{out}");
    assert!(out.contains("`org.timezone`"), "{out}");
    assert!(out.contains("`seats.ada.role`"), "{out}");
    assert!(!data.exists());
}
