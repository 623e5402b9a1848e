//! Follows through the real binary: a seat that posts in a thread follows
//! it, so a later unmentioned message there from a person wakes it, once;
//! its own message delivered back does not; a seat that said
//! `leave_thread` is not woken; and the follow, written by the node that
//! ran the turn, wakes the seat on a node that never saw it written. On a
//! node without seats, 10,000 follows for one seat cost the routing of a
//! message one read of the follows bucket, and a follower that left the
//! company is skipped, not an error.

use crate::common;

use std::time::Duration;

use common::company::{SCRIPTED_COMPANY, SLACK_SECRET, fill};
use common::fleet::{holders, posts};
use common::*;
use crewlet_coord::{ChatThread, Coord, CoordOptions, Owner};
use crewlet_testkit::{NatsServer, PluginsDir, http};
use serde_json::{Value, json};

const ADA_SLACK: &str = "U0ADA";
const CHANNEL: &str = "C0FOLLOW";
/// A person of the company's workspace, who never mentions anyone here.
const PERSON: &str = "U0PERSON";

/// `lea` answers in the thread that woke her, then leaves it.
const LEAVER: &str = r#"
[roles.leaver]
system_prompt = "You answer once, then leave the thread."
executor = [{ provider = "scripted", model = "demo", options = { steps = [
  { call = "chat__post_message", args = { channel = "{{wake.channel}}", thread = "{{wake.thread}}", text = "Once from {{wake.handle}}." } },
  { call = "leave_thread", args = {} },
  { call = "submit_work", args = { outcome = "delivered", summary = "replied, left" } },
] } }]
reviewer = { provider = "scripted", model = "demo-review", options = { steps = [
  { call = "submit_review", args = { verdict = "done" } },
] } }
{chat:leaver}
"#;

/// The scripted company (`ada` answers in the thread that woke her) with
/// `lea` beside her, each with a Slack identity, chatting into `chat_log`.
fn company(chat_log: &std::path::Path) -> String {
    let seats = "[seats]\nada = { role = \"support\" }\n";
    assert!(
        SCRIPTED_COMPANY.contains(seats),
        "the scripted company's seats moved"
    );
    let doc = SCRIPTED_COMPANY.replace(
        seats,
        &format!(
            "{LEAVER}[seats]\nada = {{ role = \"support\", identities = {{ slack = \"{ADA_SLACK}\" }} }}\n\
             lea = {{ role = \"leaver\", identities = {{ slack = \"U0LEA\" }} }}\n"
        ),
    );
    fill(&doc, chat_log)
}

/// A signed Slack event on the shared route of the node at `api`.
fn slack(node: &Node, event_id: &str, event: Value) {
    let body = json!({
        "type": "event_callback", "event_id": event_id, "team_id": "T1",
        "event": event,
    })
    .to_string();
    let (now, sig) = crewlet_ingress::sign::slack_headers(SLACK_SECRET.as_bytes(), body.as_bytes());
    let headers = [
        ("Content-Type", "application/json"),
        ("X-Slack-Request-Timestamp", now.as_str()),
        ("X-Slack-Signature", sig.as_str()),
    ];
    let r = http::post(&node.api, "/webhooks/slack", &headers, body.as_bytes());
    assert_accepted(node, &r.expect("POST webhook"));
}

/// A person's message in `thread`, mentioning nobody.
fn person_in_thread(node: &Node, event_id: &str, thread: &str, ts: &str) {
    slack(
        node,
        event_id,
        json!({"type": "message", "user": PERSON, "text": "and what about ARM?",
               "channel": CHANNEL, "ts": ts, "thread_ts": thread}),
    );
}

/// Events of `kind` for `delivery`.
fn of_delivery(node: &Node, kind: &str, delivery: &str) -> Vec<Value> {
    events(node, kind)
        .into_iter()
        .filter(|e| e["payload"]["delivery_id"] == delivery)
        .collect()
}

/// Asserts `delivery` woke ada alone, by follow, once.
fn ada_woken_by_follow(node: &Node, delivery: &str) {
    let wake = woken_once(node, delivery);
    assert_eq!(
        (wake["seat"].as_str(), wake["payload"]["reason"].as_str()),
        (Some("ada"), Some("follow")),
        "{wake}"
    );
}

/// Waits for exactly one `wake_published` for `delivery` and returns it.
fn woken_once(node: &Node, delivery: &str) -> Value {
    let mut got = Vec::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            got = of_delivery(node, "wake_published", delivery);
            !got.is_empty()
        }),
        "{delivery} woke nobody: {}",
        node.log_text()
    );
    assert_eq!(got.len(), 1, "{delivery} wakes one seat, once: {got:?}");
    got.remove(0)
}

/// Waits until `seat` has posted `n` times in `thread` of the chat log.
fn wait_posts(sb: &Sandbox, node: &Node, thread: &str, seat: &str, n: usize) {
    let log = sb.path("chat.jsonl");
    let count = || {
        posts(&log)
            .get(thread)
            .map_or(0, |by| by.iter().filter(|a| *a == seat).count())
    };
    assert!(
        eventually(Duration::from_secs(30), || count() >= n),
        "{seat} posted {} times in {thread}, not {n}: {}",
        count(),
        node.log_text()
    );
}

/// The delivery as the edge publishes it, written by `sender`.
fn delivery_from(sender: &str, id: &str, thread: &str) -> crewlet_bus::Inbound {
    crewlet_bus::Inbound {
        trace_id: format!("trace-{id}"),
        key: format!("slack:{id}"),
        delivery_id: id.into(),
        source: "slack".into(),
        event_type: "message".into(),
        route_handle: None,
        mentions: Vec::new(),
        assignees: Vec::new(),
        reviewers: Vec::new(),
        channel: Some(CHANNEL.into()),
        thread: Some(thread.into()),
        text: Some("Hello from ada!".into()),
        owed: None,
        sender: vec![sender.into()],
        wakes: crewlet_bus::Wakes::Named,
        message: None,
        received_by: "test".into(),
        received_at_ms: 0,
    }
}

/// Publishes `inbound` on the notification stream, as an edge would.
async fn publish_inbound(client: &async_nats::Client, inbound: &crewlet_bus::Inbound) {
    let js = async_nats::jetstream::new(client.clone());
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(crewlet_bus::MSG_ID_HEADER, inbound.key.as_str());
    headers.insert(crewlet_bus::TRACE_HEADER, inbound.trace_id.as_str());
    js.publish_with_headers(
        crewlet_bus::INBOUND_SUBJECT,
        headers,
        serde_json::to_vec(inbound).unwrap().into(),
    )
    .await
    .expect("publish")
    .await
    .expect("stored");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The fleet's coordination, as a node opens it on `server`.
async fn coord(server: &NatsServer) -> Coord {
    let client = async_nats::connect(server.url()).await.unwrap();
    Coord::open(
        client,
        CoordOptions::new(Owner::incarnation("follows-test")),
    )
    .await
    .expect("open coordination")
}

#[test]
fn a_seat_hears_an_unmentioned_reply_in_a_thread_it_posted_in_on_any_node() {
    let server = NatsServer::start();
    let sb = Sandbox::new();
    PluginsDir::new(sb.path("plugins"))
        .add("slack", "plugins/webhooks/slack/plugin.toml")
        .add("scripted", "plugins/providers/scripted/plugin.toml");
    std::fs::write(sb.path("company.toml"), company(&sb.path("chat.jsonl"))).unwrap();
    let spawn = |id: &str| {
        let mut n = sb
            .fleet_node(id, &[server.url()], "")
            .env("SLACK_SIGNING_SECRET", SLACK_SECRET)
            .spawn();
        n.wait_ready(Duration::from_secs(60));
        n
    };
    let mut a = spawn("follow-a");
    let rt = runtime();
    let follows = rt.block_on(coord(&server)).follows();
    let thread = ChatThread::new("slack", CHANNEL, "100.1");

    // Both seats are mentioned in a thread: each answers there, and lea
    // then leaves it.
    slack(
        &a,
        "Ev-mention",
        json!({"type": "app_mention", "user": PERSON, "text": "<@U0ADA> <@U0LEA> is the build green?",
               "channel": CHANNEL, "ts": "100.1"}),
    );
    wait_posts(&sb, &a, "100.1", "ada", 1);
    wait_posts(&sb, &a, "100.1", "lea", 1);
    let left = eventually(Duration::from_secs(30), || {
        events(&a, "tool_call").iter().any(|e| {
            e["seat"] == "lea"
                && e["payload"]["tool"] == "leave_thread"
                && e["payload"]["ok"] == true
        })
    });
    assert!(left, "lea never left: {}", a.log_text());
    let followed = events(&a, "reply_posted");
    assert!(
        followed
            .iter()
            .any(|e| e["seat"] == "ada" && e["payload"]["follows"] == "slack:C0FOLLOW#100.1"),
        "{followed:?}"
    );
    assert_eq!(rt.block_on(follows.followers(&thread)).unwrap(), ["ada"]);
    // The seat's page reads the same: ada follows the thread, lea nothing.
    let of = |seat: &str| a.get(&format!("/agents/{seat}/follows")).unwrap().json();
    let ada = of("ada");
    assert_eq!(ada["seat"], "ada");
    assert_eq!(
        (
            &ada["follows"][0]["backend"],
            &ada["follows"][0]["channel"],
            &ada["follows"][0]["thread"]
        ),
        (&json!("slack"), &json!(CHANNEL), &json!("100.1")),
        "{ada}"
    );
    assert_eq!(ada["follows"].as_array().map(Vec::len), Some(1), "{ada}");
    assert_eq!(of("lea")["follows"], json!([]));

    // A person replies in the thread, mentioning nobody: ada alone is
    // woken, by follow, once.
    person_in_thread(&a, "Ev-reply", "100.1", "100.2");
    ada_woken_by_follow(&a, "Ev-reply");
    wait_posts(&sb, &a, "100.1", "ada", 2);

    // Ada's own message delivered back wakes nobody, and says why.
    let client = rt.block_on(async_nats::connect(server.url())).unwrap();
    rt.block_on(publish_inbound(
        &client,
        &delivery_from(ADA_SLACK, "Ev-own", "100.1"),
    ));
    let own = wait_events(&a, "delivery_unrouted", 1);
    let own: Vec<&Value> = own
        .iter()
        .filter(|e| e["payload"]["delivery_id"] == "Ev-own")
        .collect();
    assert_eq!(own.len(), 1, "{own:?}");
    assert_eq!(own[0]["payload"]["authored_by"], "ada", "{}", own[0]);
    assert!(of_delivery(&a, "wake_published", "Ev-own").is_empty());

    // Node b joins; node a, which wrote the follow, drains and stops. The
    // next reply is claimed by b, which never saw the follow written.
    let b = spawn("follow-b");
    a.signal(libc::SIGTERM);
    assert!(
        a.wait_exit(Duration::from_secs(60)).success(),
        "{}",
        a.log_text()
    );
    let b_id = b.health()["node_id"].as_str().unwrap().to_owned();
    let both_on_b = eventually(Duration::from_secs(60), || {
        holders(&b).is_some_and(|h| h.len() == 2 && h.values().all(|n| *n == b_id))
    });
    assert!(both_on_b, "b never took the seats: {:?}", holders(&b));
    person_in_thread(&b, "Ev-later", "100.1", "100.3");
    ada_woken_by_follow(&b, "Ev-later");
    assert_eq!(
        of_delivery(&b, "webhook_received", "Ev-later").len(),
        1,
        "received on b"
    );
    wait_posts(&sb, &b, "100.1", "ada", 3);
    assert_eq!(
        posts(&sb.path("chat.jsonl"))["100.1"]
            .iter()
            .filter(|s| *s == "lea")
            .count(),
        1,
        "lea, who left, was never woken again"
    );
}

#[test]
fn ten_thousand_follows_cost_routing_one_read_and_a_gone_follower_is_skipped() {
    let server = NatsServer::start();
    let sb = Sandbox::new();
    let doc = sb.path("company.toml");
    std::fs::write(&doc, company(&sb.path("chat.jsonl"))).unwrap();
    let plugins = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins");
    let node = seatless_node(
        &sb,
        "follow-edge",
        &server.url(),
        &plugins,
        &doc,
        &[("SLACK_SIGNING_SECRET", SLACK_SECRET)],
    );
    let rt = runtime();
    let follows = rt.block_on(coord(&server)).follows();
    let thread = |i: usize| ChatThread::new("slack", CHANNEL, format!("1700000000.{i:06}"));
    rt.block_on(async {
        use futures::StreamExt;
        futures::stream::iter(0..10_000)
            .for_each_concurrent(64, |i| {
                let follows = &follows;
                async move {
                    follows
                        .follow(&thread(i), "ada")
                        .await
                        .expect("a follow lands");
                }
            })
            .await;
        // A seat that has since left the company follows one of them too,
        // and another thread alone.
        follows.follow(&thread(4321), "gone").await.unwrap();
        follows.follow(&thread(10_001), "gone").await.unwrap();
    });

    // Every read of the follows bucket the node asks the server for.
    let client = rt.block_on(async_nats::connect(server.url())).unwrap();
    let mut reads = rt.block_on(async {
        let s = client
            .subscribe("$JS.API.STREAM.MSG.GET.KV_crewlet_follows")
            .await
            .unwrap();
        client.flush().await.unwrap();
        s
    });
    let count_reads = |reads: &mut async_nats::Subscriber| {
        rt.block_on(async {
            use futures::StreamExt;
            let mut n = 0;
            while let Ok(Some(_)) =
                tokio::time::timeout(Duration::from_millis(500), reads.next()).await
            {
                n += 1;
            }
            n
        })
    };

    person_in_thread(&node, "Ev-busy", "1700000000.004321", "1700000001.1");
    ada_woken_by_follow(&node, "Ev-busy");
    assert_eq!(count_reads(&mut reads), 1, "one read of the thread's key");
    let taken = rt.block_on(take_wake(&client, "ada")).expect("ada's wake");
    assert_eq!(taken["reason"], "follow");
    assert_eq!(taken["thread"], "1700000000.004321");

    // A thread only the gone seat follows: addressed to nobody, acked,
    // never an error.
    person_in_thread(&node, "Ev-gone", "1700000000.010001", "1700000001.2");
    let unrouted = wait_events(&node, "delivery_unrouted", 1);
    assert!(
        unrouted
            .iter()
            .any(|e| e["payload"]["delivery_id"] == "Ev-gone"),
        "{unrouted:?}"
    );
    assert_eq!(count_reads(&mut reads), 1);

    // Ada's own message in a thread she follows: no read, no wake.
    rt.block_on(publish_inbound(
        &client,
        &delivery_from(ADA_SLACK, "Ev-own", "1700000000.004321"),
    ));
    let mut own = Vec::new();
    assert!(eventually(Duration::from_secs(30), || {
        own = of_delivery(&node, "delivery_unrouted", "Ev-own");
        !own.is_empty()
    }));
    assert_eq!(own[0]["payload"]["authored_by"], "ada", "{}", own[0]);
    assert_eq!(
        count_reads(&mut reads),
        0,
        "a seat's own message reads nothing"
    );
    assert!(events(&node, "delivery_dead_lettered").is_empty());
    assert!(
        rt.block_on(take_wake(&client, "ada")).is_none(),
        "no other wake"
    );
}
