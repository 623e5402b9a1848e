//! A secret the node does not know yet is unknown, never unset — through
//! the real binary on real nats-servers: a secrets bucket out of this
//! node's reach at start (its watch refused by the broker's permissions)
//! that comes back (the broker restarted with the permission granted), a secrets bucket deleted under a running node, and a
//! model key rotated while a turn holds the old one.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Node, Sandbox, broker_login, eventually};
use crewlet_testkit::nats::{NatsServer, ServerSpec};
use crewlet_testkit::openai::ScriptedOpenAi;
use serde_json::{Value, json};

use crate::common::company::SLACK_SECRET;
use crate::turns::{post, submit, verdict};

const BUCKET: &str = "crewlet_secrets";

/// A broker whose `node` user may do anything but open a consumer on the
/// secrets bucket (`deny_secrets`), and an `admin` user for the test.
fn broker_conf(path: &Path, deny_secrets: bool) {
    let deny = if deny_secrets {
        format!(
            r#", deny: ["$JS.API.CONSUMER.CREATE.KV_{BUCKET}", "$JS.API.CONSUMER.CREATE.KV_{BUCKET}.>", "$JS.API.CONSUMER.DURABLE.CREATE.KV_{BUCKET}.>"]"#
        )
    } else {
        String::new()
    };
    std::fs::write(
        path,
        format!(
            r#"authorization {{
  users = [
    {{ user: "admin", password: "admin-pw" }}
    {{ user: "node", password: "node-pw", permissions: {{ publish: {{ allow: [">"]{deny} }}, subscribe: {{ allow: [">"] }} }} }}
  ]
}}
"#
        ),
    )
    .unwrap();
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Seals `values` with the keyring at `keyring` into the secrets bucket on
/// `url` (created here, as a fleet's earlier node would have).
fn seed_bucket(url: &str, keyring: &Path, values: &[(&str, &str)]) {
    let ring = crewlet_secrets::Keyring::open_or_create(keyring).unwrap();
    rt().block_on(async {
        let client =
            async_nats::ConnectOptions::with_user_and_password("admin".into(), "admin-pw".into())
                .connect(url)
                .await
                .unwrap();
        let js = async_nats::jetstream::new(client);
        let kv = js
            .create_key_value(async_nats::jetstream::kv::Config {
                bucket: BUCKET.into(),
                history: 1,
                storage: async_nats::jetstream::stream::StorageType::File,
                ..Default::default()
            })
            .await
            .unwrap();
        for (name, value) in values {
            let record = crewlet_secrets::Record::seal(&ring, name, value).unwrap();
            let key = format!("secret.{}", crewlet_coord::names::encode_token(name));
            kv.put(key, record.to_bytes()).await.unwrap();
        }
    });
}

/// A wake straight onto `handle`'s mailbox (the webhook edge answers 503
/// while secrets are unknown, so the work arrives the way a peer's would).
fn publish_wake(url: &str, login: async_nats::ConnectOptions, handle: &str, delivery: &str) {
    rt().block_on(async {
        let client = login.connect(url).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let seat_id = crewlet_company::seat_id(
            "Acme",
            &crewlet_company::Handle::parse(handle).unwrap(),
        );
        let payload = json!({
            "trace_id": format!("trace-{delivery}"), "delivery_id": delivery, "source": "slack",
            "event_type": "app_mention", "handle": handle, "seat_id": seat_id.to_string(),
            "reason": "route", "text": format!("<@{handle}> hello"),
            "conversation": format!("C-{handle}#1.1"), "channel": format!("C-{handle}"), "thread": "1.1",
        });
        js.publish(crewlet_bus::inbox_subject(handle), payload.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
    });
}

fn slack_status(node: &Node, handle: &str, event_id: &str) -> crewlet_testkit::http::Response {
    let body = json!({
        "type": "event_callback", "event_id": event_id, "team_id": "T1",
        "event": {"type": "app_mention", "user": "U1", "text": "hi", "channel": "C9", "ts": "9.9"},
    })
    .to_string();
    let (now, sig) = crewlet_ingress::sign::slack_headers(SLACK_SECRET.as_bytes(), body.as_bytes());
    crewlet_testkit::http::post(
        &node.api,
        &format!("/webhooks/slack/{handle}"),
        &[
            ("Content-Type", "application/json"),
            ("X-Slack-Request-Timestamp", &now),
            ("X-Slack-Signature", &sig),
        ],
        body.as_bytes(),
    )
    .unwrap()
}

fn turn_outcomes(node: &Node, seat: &str) -> Vec<String> {
    let mut ended = common::events(node, "turn_ended");
    ended.reverse();
    ended
        .iter()
        .filter(|e| e["seat"] == seat || e["payload"]["seat"] == seat)
        .map(|e| e["payload"]["outcome"].as_str().unwrap_or("?").to_owned())
        .collect()
}

fn posts(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a post is JSON"))
        .collect()
}

const COMPANY: &str = r#"
[org]
name = "Acme"
[roles.support]
system_prompt = "You answer questions in chat."
executor = [{ provider = "openai", model = "exec-a", credentials = "${MODEL_KEY}" }]
reviewer = { provider = "openai", model = "review-a", credentials = "${MODEL_KEY}" }
max_iterations = 2
{chat}
[roles.ops]
system_prompt = "You answer questions in chat."
executor = [{ provider = "openai", model = "exec-b", credentials = "${MODEL_KEY}" }]
reviewer = { provider = "openai", model = "review-b", credentials = "${MODEL_KEY}" }
max_iterations = 2
[roles.ops.mcp.chat]
command = "crewlet"
args = ["mcp", "chat"]
env = { CHAT_IDENTITY = "${OPS_CHAT_NAME}", CHAT_LOG = "CHAT_LOG_PATH" }
replies = ["post_message"]
[seats]
ada = { role = "support" }
bob = { role = "ops" }
[integrations.slack]
plugin = "slack"
secret = "SLACK_SIGNING_SECRET"
"#;

/// A node whose secrets bucket is out of its reach from its start: the
/// broker lets its user do anything but open a consumer on the bucket, which
/// holds the current model key and the ops seat's chat identity; the node's
/// environment holds a stale key.
struct OutOfReach {
    sb: Sandbox,
    conf: PathBuf,
    server: NatsServer,
    url: String,
    node: Node,
    ai: ScriptedOpenAi,
    chat_log: PathBuf,
}

impl OutOfReach {
    /// `company` filled in for the chat log (`crate::common::company::fill`), on a node ready.
    fn start(company: &str) -> OutOfReach {
        let sb = Sandbox::new();
        let conf = sb.path("nats.conf");
        broker_conf(&conf, true);
        let server = NatsServer::spawn(ServerSpec {
            name: format!("secrets-{}", crewlet_testkit::free_port()),
            port: crewlet_testkit::free_port(),
            monitor_port: crewlet_testkit::free_port(),
            store_dir: sb.path("broker"),
            extra_args: vec!["--config".into(), conf.display().to_string()],
        });
        server.wait_healthy(Duration::from_secs(20));
        let url = server.url();
        std::fs::create_dir_all(sb.data_dir()).unwrap();
        seed_bucket(
            &url,
            &sb.data_dir().join("keyring"),
            &[
                ("MODEL_KEY", "sk-from-the-bucket"),
                ("OPS_CHAT_NAME", "bob-from-the-bucket"),
            ],
        );
        let ai = ScriptedOpenAi::start();
        crate::turns::plugins(&sb, Some(&ai));
        let chat_log = sb.path("chat.jsonl");
        std::fs::write(
            sb.path("company.toml"),
            crate::common::company::fill(company, &chat_log),
        )
        .unwrap();
        let mut node = sb
            .node(&format!(
                "[stream]\nurl = \"{url}\"\nuser = \"node\"\npassword = \"node-pw\"\n[coordination]\nheartbeat_seconds = 1\nlease_ttl_seconds = 3\n"
            ))
            .arg("--company")
            .arg(sb.path("company.toml"))
            .arg("--plugins")
            .arg(sb.path("plugins"))
            .env("SLACK_SIGNING_SECRET", SLACK_SECRET)
            .env("MODEL_KEY", "sk-stale-in-the-environment")
            .env_remove("OPS_CHAT_NAME")
            .spawn();
        node.wait_ready(Duration::from_secs(60));
        OutOfReach {
            sb,
            conf,
            server,
            url,
            node,
            ai,
            chat_log,
        }
    }
}

/// The broker comes back letting the node read the bucket (restarted with
/// the permission granted; the node reconnects). Answers when.
fn reach(conf: &Path, server: &mut NatsServer) -> Instant {
    let reached = Instant::now();
    broker_conf(conf, false);
    server.restart();
    server.wait_healthy(Duration::from_secs(20));
    reached
}

#[test]
fn a_bucket_out_of_reach_at_start_is_unknown_until_it_answers_and_no_work_is_lost() {
    let OutOfReach {
        sb: _sb,
        conf,
        mut server,
        url,
        mut node,
        ai,
        chat_log,
    } = OutOfReach::start(COMPANY);
    let login =
        || async_nats::ConnectOptions::with_user_and_password("admin".into(), "admin-pw".into());

    // Unknown: the edge says 503 + Retry-After (the environment's signing
    // secret is not used as if the bucket had said "unset").
    let r = slack_status(&node, "ada", "Ev-unknown");
    assert_eq!(r.status, 503, "{}\n{}", r.text(), node.log_text());
    assert!(r.header("retry-after").is_some(), "{:?}", r.headers);
    let r = node.get("/secrets").unwrap();
    assert_eq!(r.status, 503, "{}", r.text());

    // Work arrives for both seats meanwhile.
    ai.reply("exec-a", post("C-ada", "1.1", "ada here"));
    ai.reply("exec-a", submit("delivered"));
    ai.reply("review-a", verdict("done"));
    ai.reply("exec-b", post("C-bob", "1.1", "bob here"));
    ai.reply("exec-b", submit("delivered"));
    ai.reply("review-b", verdict("done"));
    publish_wake(&url, login(), "ada", "w-ada");
    publish_wake(&url, login(), "bob", "w-bob");
    // ada is equipped (her chat child needs no secret); her turn finds the
    // model key unknown: an outage, retried, never `llm_unavailable`, and
    // no model call with the stale key.
    assert!(
        eventually(Duration::from_secs(60), || turn_outcomes(&node, "ada")
            .iter()
            .any(|o| o == "outage")),
        "{:?}\n{}",
        turn_outcomes(&node, "ada"),
        node.log_text()
    );
    assert!(
        ai.requests().is_empty(),
        "a model was called with a key not known"
    );
    // bob's chat child needs a secret only the bucket holds: not started,
    // the seat not equipped, his wake left in his mailbox.
    assert!(
        eventually(Duration::from_secs(30), || node
            .log_text()
            .contains("waits for its credential")),
        "{}",
        node.log_text()
    );
    assert!(turn_outcomes(&node, "bob").is_empty());
    assert!(posts(&chat_log).is_empty());

    let reached = reach(&conf, &mut server);

    let mut seen = Vec::new();
    assert!(
        eventually(Duration::from_secs(90), || {
            seen = posts(&chat_log);
            seen.len() >= 2
        }),
        "{seen:?}\n{}",
        node.log_text()
    );
    let answered = reached.elapsed();
    let by = |who: &str| seen.iter().filter(|p| p["as"] == who).count();
    assert_eq!(by("ada"), 1, "{seen:?}");
    assert_eq!(
        by("bob-from-the-bucket"),
        1,
        "bob re-equipped with the bucket's value: {seen:?}"
    );
    for req in ai.requests() {
        assert_eq!(
            req.bearer.as_deref(),
            Some("sk-from-the-bucket"),
            "the bucket wins over a stale environment value"
        );
    }
    assert!(common::events(&node, "llm_unavailable").is_empty());
    // A turn's events are recorded off its critical path: after its post.
    let (mut ada, mut bob) = (Vec::new(), Vec::new());
    let delivered = |o: &Vec<String>| o.iter().any(|o| o == "delivered");
    assert!(
        eventually(Duration::from_secs(30), || {
            (ada, bob) = (turn_outcomes(&node, "ada"), turn_outcomes(&node, "bob"));
            delivered(&ada) && delivered(&bob)
        }),
        "{ada:?} {bob:?}\n{}",
        node.log_text()
    );
    eprintln!("ada's turns: {ada:?}; bob's: {bob:?}");
    assert_eq!(
        ada.iter().filter(|o| *o == "delivered").count(),
        1,
        "{ada:?}\n{}",
        node.log_text()
    );
    assert_eq!(bob, ["delivered"], "{}", node.log_text());
    eprintln!("both wakes answered {answered:?} after the bucket came back");

    // Known now: where each name answers from.
    let listed = node.get("/secrets").unwrap().json();
    let row = |name: &str| {
        listed["secrets"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(listed["outside_bucket"].as_array().into_iter().flatten())
            .find(|r| r["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} not in {listed}"))
    };
    assert_eq!(row("MODEL_KEY")["source"], "bucket", "{listed}");
    assert_eq!(row("MODEL_KEY")["environment_too"], true, "{listed}");
    assert_eq!(
        row("SLACK_SIGNING_SECRET")["source"],
        "environment",
        "{listed}"
    );
    assert!(
        listed["precedence"]
            .as_str()
            .unwrap()
            .starts_with("a name the fleet's secrets bucket holds")
    );
    assert!(!listed.to_string().contains("sk-from-the-bucket"));
    node.signal(libc::SIGTERM);
    assert!(node.wait_exit(Duration::from_secs(30)).success());
}

/// `/health` `secrets` of `node`.
fn standing(node: &Node) -> Value {
    node.health()["secrets"].clone()
}

/// Milliseconds since the epoch on this machine's clock (the node's too).
fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The doctor's finding on the running node's secrets.
fn doctor_says(sb: &Sandbox) -> Value {
    let config = std::fs::read_to_string(sb.path("node.toml")).unwrap();
    let company = std::fs::read_to_string(sb.path("company.toml")).unwrap();
    let (_, findings) = crate::doctor::doctor(sb, &config, &company, &[]);
    crate::doctor::finding(&findings, "node secrets", "").clone()
}

#[test]
fn a_seat_waiting_for_a_secret_is_equipped_the_moment_it_is_known_not_after_its_backoff() {
    // bob's own server (`desk`) needs a name only the bucket holds.
    let company = COMPANY.replace("[roles.ops.mcp.chat]", "[roles.ops.mcp.desk]");
    let OutOfReach {
        sb,
        conf,
        mut server,
        mut node,
        ..
    } = OutOfReach::start(&company);
    // Unknown, and said so: on /health, with why, and by the doctor.
    let mut seen = Value::Null;
    assert!(
        eventually(Duration::from_secs(30), || {
            seen = standing(&node);
            seen["error"].is_string()
        }),
        "{seen}\n{}",
        node.log_text()
    );
    assert_eq!(
        (seen["state"].as_str(), seen["source"].as_str()),
        (Some("unknown"), Some("none")),
        "{seen}"
    );
    let said = doctor_says(&sb);
    assert_eq!(said["verdict"], "warn", "{said}");
    assert!(
        said["detail"].as_str().unwrap().contains("unknown"),
        "{said}"
    );

    // Out of reach long enough that bob's backoff is long: his equip gave
    // up twice (30 s each), so the next one is 20 s away.
    let failed = |n: usize| {
        node.log_text()
            .lines()
            .filter(|l| l.contains("equipping the seat failed") && l.contains("seat=bob"))
            .count()
            >= n
    };
    assert!(
        eventually(Duration::from_secs(150), || failed(2)),
        "{}",
        node.log_text()
    );
    let desk = |node: &Node| {
        node.health()["mcp"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["server"] == "desk" && r["started"].as_u64() >= Some(1))
    };
    assert!(!desk(&node), "desk started without its credential");
    let reached_ms = wall_ms();
    reach(&conf, &mut server);

    // Known: the bucket answered; bob holds his server within a few
    // seconds of it, not after the 20 s left of his backoff.
    assert!(
        eventually(Duration::from_secs(60), || {
            seen = standing(&node);
            seen["state"] == "known"
        }),
        "{seen}\n{}",
        node.log_text()
    );
    let known_ms = seen["since_ms"].as_i64().unwrap();
    assert_eq!(seen["source"], "bucket", "{seen}");
    assert!(seen["error"].is_null(), "{seen}");
    let mut held_ms = 0;
    assert!(
        eventually(Duration::from_secs(60), || {
            held_ms = wall_ms();
            desk(&node)
        }),
        "{}",
        node.log_text()
    );
    let after_known = held_ms - known_ms;
    eprintln!(
        "bob held desk {after_known} ms after his secrets were known, {} ms after the bucket came back",
        held_ms - reached_ms
    );
    assert!(
        after_known < 5_000,
        "held {after_known} ms after the secret was known: the seat waited for its backoff\n{}",
        node.log_text()
    );
    let said = doctor_says(&sb);
    assert_eq!(said["verdict"], "ok", "{said}");
    assert!(said["detail"].as_str().unwrap().contains("knows"), "{said}");
    node.signal(libc::SIGTERM);
    assert!(node.wait_exit(Duration::from_secs(30)).success());
}

/// A node without seats on its embedded broker, the example company, no
/// signing secret in its environment.
fn edge_node(sb: &Sandbox) -> Node {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut node = sb
        .node("[node]\nid = \"edge\"\nroles = [\"data\", \"ingress\", \"workers\"]\n")
        .arg("--plugins")
        .arg(root.join("plugins"))
        .arg("--company")
        .arg(root.join("examples/company.toml"))
        .env_remove("GITHUB_WEBHOOK_SECRET")
        .spawn();
    node.wait_ready(Duration::from_secs(60));
    node
}

fn deliver(node: &Node, secret: &str, delivery: &str) -> u16 {
    let body = serde_json::to_vec(&json!({
        "action": "created",
        "issue": { "number": 7, "title": "t" },
        "comment": { "body": "hello @ada" },
        "repository": { "full_name": "acme/robot" },
        "sender": { "login": "octocat" },
    }))
    .unwrap();
    let sig = crewlet_ingress::sign::github_signature(secret.as_bytes(), &body);
    crewlet_testkit::http::post(
        &node.api,
        "/webhooks/github",
        &[
            ("Content-Type", "application/json"),
            ("X-GitHub-Event", "issue_comment"),
            ("X-GitHub-Delivery", delivery),
            ("X-Hub-Signature-256", &sig),
        ],
        &body,
    )
    .unwrap()
    .status
}

#[test]
fn a_secrets_bucket_deleted_under_a_running_node_is_created_again_and_read_truly() {
    let sb = Sandbox::new();
    const HOOK: &str = "hook-before-the-bucket-went";
    let node = edge_node(&sb);
    let r = crewlet_testkit::http::request(
        &node.api,
        "PUT",
        "/secrets/GITHUB_WEBHOOK_SECRET",
        &[],
        HOOK.as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(deliver(&node, HOOK, "del-1"), 202);

    let health = node.health();
    let url = health["stream"]["urls"][0].as_str().unwrap().to_owned();
    rt().block_on(async {
        let client = broker_login(&health).connect(&url).await.unwrap();
        let js = async_nats::jetstream::new(client);
        js.delete_key_value(BUCKET).await.unwrap();
    });

    // The node notices, creates the bucket again, and its (empty) listing
    // replaces the snapshot: the secret is unset now, not served from
    // memory, and the node stays ready.
    let mut last = Value::Null;
    assert!(
        eventually(Duration::from_secs(90), || {
            let r = node.get("/secrets").unwrap();
            last = if r.status == 200 {
                r.json()
            } else {
                Value::Null
            };
            last["secrets"].as_array().is_some_and(Vec::is_empty)
                && last["outside_bucket"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|r| r["name"] == "GITHUB_WEBHOOK_SECRET" && r["source"] == "unset")
        }),
        "{last}\n{}",
        node.log_text()
    );
    let mut n = 0;
    assert!(
        eventually(Duration::from_secs(60), || {
            n += 1;
            deliver(&node, HOOK, &format!("del-gone-{n}")) == 503
        }),
        "the removed value is not served from memory\n{}",
        node.log_text()
    );
    assert_eq!(node.get("/ready").unwrap().status, 200);

    // Set again: served at once.
    let r = crewlet_testkit::http::request(
        &node.api,
        "PUT",
        "/secrets/GITHUB_WEBHOOK_SECRET",
        &[],
        b"hook-after",
    )
    .unwrap();
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(deliver(&node, "hook-after", "del-2"), 202);
    assert!(!node.log_text().contains(HOOK));
}

const ROTATING: &str = crate::common::company::OPENAI_ONE_SEAT;

#[test]
fn a_model_key_rotated_while_a_turn_holds_the_old_one_serves_that_same_turn() {
    let ai = ScriptedOpenAi::start();
    let w = crate::turns::start(ROTATING, Some(&ai), &[]);
    let put = |value: &str| {
        let r = crewlet_testkit::http::request(
            &w.node.api,
            "PUT",
            "/secrets/MODEL_KEY",
            &[],
            value.as_bytes(),
        )
        .unwrap();
        assert_eq!(r.status, 204, "{}", r.text());
    };
    put("sk-old-0001");
    // The vendor takes a while, then refuses the old key: it was rotated
    // there meanwhile.
    const SLOW: Duration = Duration::from_secs(5);
    ai.reply(
        "exec-a",
        crewlet_testkit::openai::Reply::Delayed(
            SLOW,
            Box::new(crewlet_testkit::openai::Reply::error(
                401,
                "Incorrect API key provided",
            )),
        ),
    );
    ai.reply("exec-a", post("C1", "17.1", "answered with the new key"));
    ai.reply("exec-a", submit("delivered"));
    ai.reply("review", verdict("done"));
    w.mention("ada", "Ev-rot", "C1", "17.1", "<@ada> help");
    assert!(
        eventually(Duration::from_secs(30), || ai.request_count() >= 1),
        "{}",
        w.node.log_text()
    );
    put("sk-new-0002");
    let first = ai.requests()[0].at;
    assert!(
        first.elapsed() < SLOW,
        "the rotation landed after the old key's answer; raise SLOW"
    );
    w.wait_events("turn_ended", 1);
    assert_eq!(crate::turns::outcomes(&w), ["delivered"]);
    let keys: Vec<_> = ai.requests().into_iter().map(|r| r.bearer).collect();
    assert_eq!(keys[0].as_deref(), Some("sk-old-0001"));
    assert!(
        keys[1..]
            .iter()
            .all(|k| k.as_deref() == Some("sk-new-0002")),
        "{keys:?}"
    );
    assert_eq!(w.posts().len(), 1);
    assert!(w.events("llm_unavailable").is_empty());
    assert_eq!(
        w.events("credential_benched").len(),
        1,
        "the old key benched"
    );
}
