//! What a peer did not say, through the real binary: a presence record
//! written by another build (keys this one does not know, known ones
//! missing) straight into the coordination bucket of a real nats-server.
//! `/fleet` shows the missing fields as null and `crewlet fleet` as "not
//! reported", never 0 / false; placement counts the peer, whose `draining`
//! is not reported, as live (its share of two seats is one), and stops
//! counting it once it says it drains.

use std::time::Duration;

use crate::common::*;
use crewlet_coord::{Coord, CoordOptions, NodeStatus, Owner};
use crewlet_testkit::{NatsServer, PluginsDir};
use serde_json::{Value, json};

const COMPANY: &str = r#"
[org]
name = "Acme"
[roles.ops]
system_prompt = "You keep things running."
executor = [{ provider = "scripted", model = "demo", options = { steps = [
  { call = "submit_work", args = { outcome = "delivered", summary = "done" } },
] } }]
reviewer = { provider = "scripted", model = "demo-review", options = { steps = [
  { call = "submit_review", args = { verdict = "done" } },
] } }
[seats]
ada = { role = "ops" }
bob = { role = "ops" }
"#;

/// Long enough that the peer's record (aged out with the leases bucket)
/// outlives the test's reads.
const TTL_SECONDS: u64 = 60;
const WITHIN: Duration = Duration::from_secs(30);

/// `old-peer`'s presence lease, as another build holds it.
struct OldPeer {
    owner: String,
    epoch: u64,
    key: String,
}

impl OldPeer {
    /// Acquired by this build (which mints the epoch the record needs).
    fn acquire(rt: &tokio::runtime::Runtime, server: &NatsServer) -> OldPeer {
        rt.block_on(async {
            let client = async_nats::connect(server.url()).await.unwrap();
            let mut opts = CoordOptions::new(Owner::incarnation("old-peer"));
            opts.lease_ttl = Duration::from_secs(TTL_SECONDS);
            opts.heartbeat = Duration::from_secs(1);
            let coord = Coord::open(client, opts).await.unwrap();
            let owner = coord.options().owner.clone();
            let lease = coord
                .acquire_presence("old-peer", &owner, NodeStatus::default())
                .await
                .unwrap()
                .yes()
                .unwrap();
            OldPeer {
                owner: owner.as_str().to_owned(),
                epoch: lease.epoch.get(),
                key: lease.name.key(),
            }
        })
    }

    /// Writes the record as the other build would, `status` as given,
    /// straight into the leases bucket (same owner and epoch).
    fn say(&self, rt: &tokio::runtime::Runtime, server: &NatsServer, status: Value) {
        let record = json!({
            "owner": self.owner,
            "epoch": self.epoch,
            "ttl_ms": TTL_SECONDS * 1000,
            "status": status,
        });
        rt.block_on(async {
            let client = async_nats::connect(server.url()).await.unwrap();
            async_nats::jetstream::new(client)
                .get_key_value("crewlet_leases")
                .await
                .unwrap()
                .put(
                    self.key.clone(),
                    serde_json::to_vec(&record).unwrap().into(),
                )
                .await
                .unwrap();
        });
    }
}

fn fleet_row(node: &Node, id: &str) -> Option<Value> {
    let r = node.get("/fleet")?;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["nodes"]
        .as_array()?
        .iter()
        .find(|n| n["id"] == id)
        .cloned()
}

fn seats_held(node: &Node) -> Option<u64> {
    node.health()["seats_held"].as_u64()
}

#[test]
fn a_peer_status_missing_known_fields_is_not_reported_in_fleet_and_live_for_placement() {
    let server = NatsServer::start();
    let sb = Sandbox::new();
    std::fs::write(sb.path("company.toml"), COMPANY).unwrap();
    PluginsDir::new(sb.path("plugins")).add("scripted", "plugins/providers/scripted/plugin.toml");
    let mut node = sb
        .fleet_node(
            "new-1",
            &[server.url()],
            &format!("[coordination]\nlease_ttl_seconds = {TTL_SECONDS}\nheartbeat_seconds = 1\n"),
        )
        .spawn();
    node.wait_ready(Duration::from_secs(60));
    assert!(
        eventually(WITHIN, || seats_held(&node) == Some(2)),
        "alone, the node holds both seats: {}",
        node.health()
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let peer = OldPeer::acquire(&rt, &server);
    peer.say(
        &rt,
        &server,
        json!({
            "roles": ["seats"],
            "labels": {},
            "build": "an older one",
            "gpu": {"temperature_c": 71},
        }),
    );
    let mut row = None;
    assert!(
        eventually(WITHIN, || {
            row = fleet_row(&node, "old-peer");
            row.is_some()
        }),
        "the peer is in /fleet"
    );
    let row = row.unwrap();
    for field in [
        "turns_in_flight",
        "draining",
        "seats_held",
        "posture",
        "started_at_ms",
        "mcp",
        "duties",
    ] {
        assert!(row[field].is_null(), "{field} not reported: {row}");
    }
    assert_eq!(row["roles"], json!(["seats"]), "{row}");
    assert!(
        row.get("gpu").is_none(),
        "unknown keys are not echoed: {row}"
    );
    // This node's own row says what it knows, zeros included.
    let me = fleet_row(&node, "new-1").unwrap();
    assert_eq!(me["draining"], false, "{me}");
    assert!(me["turns_in_flight"].is_u64(), "{me}");

    let api = format!("http://{}", node.api);
    let (status, out) = run_to_exit(&["fleet", "--api", &api], &[]);
    assert!(status.success(), "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("old-peer "))
        .unwrap_or_else(|| panic!("no old-peer row:\n{out}"));
    assert!(line.contains("not reported"), "{out}");
    let mine = out.lines().find(|l| l.starts_with("new-1")).unwrap();
    assert!(!mine.contains("not reported"), "{out}");

    // Placement: the peer's `draining` is not reported, so it counts as a
    // live seat node, and this node's share of two seats is one.
    assert!(
        eventually(WITHIN, || seats_held(&node) == Some(1)),
        "the peer counts as live: {}",
        node.health()
    );
    // Once it says it drains, it does not: the share is both seats again.
    peer.say(&rt, &server, json!({"roles": ["seats"], "draining": true}));
    assert!(
        eventually(WITHIN, || seats_held(&node) == Some(2)),
        "a peer that says it drains is not counted: {}",
        node.health()
    );
    assert_eq!(fleet_row(&node, "old-peer").unwrap()["draining"], true);
}
