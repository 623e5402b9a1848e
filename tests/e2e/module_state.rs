//! Module state through the real binary (ADR 202), on a three-server
//! cluster: the Live row — a module puts on one node, another node's watch
//! sees it, a node started afterwards reads it at start — with the buckets
//! at the fleet's replica count; a watch kept (or re-opened) across a
//! killed server and never ended in silence, shown on `/plugins`; and a
//! bucket filled to its 64 MiB cap refusing the module as `bucket-full`
//! while the node stays up.
//!
//! What the nodes' modules saw is read from outside: the `relay` test
//! module (`plugins/testdata/state-relay`) says `hello.<id>` at start and
//! writes `saw.<id>.<other>` = `current` or `put` for each hello its watch
//! hands it.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::*;
use crewlet_coord::{BucketName, NamedKv, NatsKv};
use crewlet_testkit::{Cluster, NatsServer, PluginsDir, free_port};

const NO_SEATS: &str = r#"["data", "ingress", "workers"]"#;
const RELAY_BUCKET: &str = "mod_relay_seen";

fn plugins(name: &str, manifest: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    PluginsDir::new(tmp.path()).add(name, manifest);
    tmp
}

fn node(urls: &[String], replicas: usize, id: &str, plugins: &Path) -> (Sandbox, Node) {
    let sb = Sandbox::new();
    let port = free_port();
    let urls: Vec<String> = urls.iter().map(|u| format!("{u:?}")).collect();
    let cfg = sb.config(
        port,
        &format!(
            "[node]\nid = \"{id}\"\nroles = {NO_SEATS}\n[stream]\nurl = [{}]\nreplicas = {replicas}\n",
            urls.join(", ")
        ),
    );
    let mut node = NodeBuilder::new(&sb, port)
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(sb.data_dir())
        .arg("--plugins")
        .arg(plugins)
        .spawn();
    node.wait_ready(Duration::from_secs(90));
    (sb, node)
}

/// Reads a bucket from outside the nodes: a certified listing and leader
/// reads (`None` while the store cannot answer).
struct Reader {
    rt: tokio::runtime::Runtime,
    kv: NatsKv,
    client: async_nats::Client,
}

impl Reader {
    fn new(urls: &[String]) -> Reader {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let client = rt.block_on(async_nats::connect(urls)).unwrap();
        let kv = {
            // The JetStream context spawns onto the runtime it is made in.
            let _in = rt.enter();
            NatsKv::named_only(client.clone(), Duration::from_secs(5))
        };
        Reader { rt, kv, client }
    }

    fn all(&self, bucket: &str) -> Option<BTreeMap<String, String>> {
        let name = BucketName::new(bucket).unwrap();
        let listed = self.rt.block_on(self.kv.list(&name, None)).ok()?;
        Some(
            listed
                .into_iter()
                .map(|e| (e.key, String::from_utf8_lossy(&e.value).into_owned()))
                .collect(),
        )
    }

    fn hellos(&self) -> Vec<String> {
        self.all(RELAY_BUCKET)
            .unwrap_or_default()
            .keys()
            .filter_map(|k| k.strip_prefix("hello.").map(str::to_owned))
            .collect()
    }

    /// The one hello not in `known`, once there is exactly one.
    fn new_hello(&self, known: &[String]) -> String {
        let mut found = Vec::new();
        let ok = eventually(Duration::from_secs(30), || {
            found = self
                .hellos()
                .into_iter()
                .filter(|h| !known.contains(h))
                .collect();
            found.len() == 1
        });
        assert!(
            ok,
            "one new hello expected besides {known:?}, saw {found:?}"
        );
        found.remove(0)
    }

    /// Waits until `saw.<who>.<other>` is `how` for every `(who, other, how)`.
    fn until_saw(&self, want: &[(&str, &str, &str)], within: Duration) {
        let mut last = BTreeMap::new();
        let ok = eventually(within, || {
            last = self.all(RELAY_BUCKET).unwrap_or_default();
            want.iter().all(|(who, other, how)| {
                last.get(&format!("saw.{who}.{other}")).map(String::as_str) == Some(*how)
            })
        });
        assert!(
            ok,
            "expected {want:?} within {within:?}; the bucket holds {last:#?}"
        );
    }

    fn try_stream_info(&self, bucket: &str) -> Option<async_nats::jetstream::stream::Info> {
        self.rt.block_on(async {
            let js = async_nats::jetstream::new(self.client.clone());
            js.get_stream(format!("KV_{bucket}"))
                .await
                .ok()?
                .get_info()
                .await
                .ok()
        })
    }

    fn stream_info(&self, bucket: &str) -> async_nats::jetstream::stream::Info {
        self.try_stream_info(bucket)
            .unwrap_or_else(|| panic!("the stream of {bucket} answers"))
    }

    /// The cluster member that leads the bucket's stream.
    fn leader_of(&self, bucket: &str, cluster: &Cluster) -> usize {
        let mut leader = None;
        let ok = eventually(Duration::from_secs(30), || {
            leader = self
                .try_stream_info(bucket)
                .and_then(|i| i.cluster)
                .and_then(|c| c.leader)
                .and_then(|l| (0..3).find(|&i| cluster.server_name(i) == l));
            leader.is_some()
        });
        assert!(ok, "the stream of {bucket} has no leader");
        leader.unwrap()
    }
}

/// The `relay` entry of a node's `/plugins`, its watches.
fn relay_watches(node: &Node) -> Vec<serde_json::Value> {
    let view = node.get("/plugins").expect("/plugins answers").json();
    view["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "relay")
        .unwrap_or_else(|| panic!("relay loaded: {view}"))["watches"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn watch_is(node: &Node, within: Duration, cond: impl Fn(&serde_json::Value) -> bool) -> bool {
    eventually(within, || {
        let w = relay_watches(node);
        w.len() == 1 && cond(&w[0])
    })
}

/// ADR 202's Live row on an R3 fleet, then a server killed under it: the
/// watches on the nodes keep (or re-open) and deliver what is written after
/// the kill; `/plugins` shows each watch live again.
#[test]
fn a_put_on_one_node_is_seen_by_the_others_at_start_and_live_across_a_killed_server() {
    let mut cluster = Cluster::start();
    let urls = cluster.urls();
    let plugins = plugins("relay", "plugins/testdata/state-relay/plugin.toml");
    let reader = Reader::new(&urls);

    let (_sa, a) = node(&urls, 3, "state-a", plugins.path());
    let id_a = reader.new_hello(&[]);
    assert_eq!(
        reader.stream_info(RELAY_BUCKET).config.num_replicas,
        3,
        "the module bucket is at the fleet's stream.replicas"
    );
    let (_sb, b) = node(&urls, 3, "state-b", plugins.path());
    let id_b = reader.new_hello(std::slice::from_ref(&id_a));
    // B read A's hello at start; A's watch saw B's hello as it was written.
    reader.until_saw(
        &[(&id_b, &id_a, "current"), (&id_a, &id_b, "put")],
        Duration::from_secs(30),
    );
    for n in [&a, &b] {
        assert!(
            watch_is(n, Duration::from_secs(10), |w| w["bucket"] == "seen"
                && w["state"] == "live"),
            "{:?}",
            relay_watches(n)
        );
    }

    // Kill the server leading the bucket's stream.
    let killed = reader.leader_of(RELAY_BUCKET, &cluster);
    cluster.stop(killed);
    // The survivors settle first: a node that starts while the meta group
    // re-elects fails its own start (a stream read times out).
    cluster.wait_ready(Duration::from_secs(60));
    assert_ne!(reader.leader_of(RELAY_BUCKET, &cluster), killed);
    // A node started afterwards reads both hellos at start, and the
    // watches on A and B hand their modules its hello.
    let (_sc, c) = node(&urls, 3, "state-c", plugins.path());
    let id_c = reader.new_hello(&[id_a.clone(), id_b.clone()]);
    reader.until_saw(
        &[
            (&id_c, &id_a, "current"),
            (&id_c, &id_b, "current"),
            (&id_a, &id_c, "put"),
            (&id_b, &id_c, "put"),
        ],
        Duration::from_secs(90),
    );
    for n in [&a, &b, &c] {
        assert!(
            watch_is(n, Duration::from_secs(60), |w| w["state"] == "live"),
            "{:?}",
            relay_watches(n)
        );
        assert_eq!(n.health()["plugins"]["watches_reopening"], 0);
        eprintln!("{}: {:?}", n.api, relay_watches(n));
    }
}

/// The fleet of the incident: buckets at one replica on a three-server
/// cluster. Killing the server that holds the module's bucket puts every
/// node's watch on `/plugins` as re-opening, with its attempts and error,
/// and `/health` counts it; once the server is back the watches are live
/// again and deliver what is written next.
#[test]
fn a_watch_whose_r1_bucket_went_away_is_shown_reopening_and_resumes() {
    let mut cluster = Cluster::start();
    let urls = cluster.urls();
    let plugins = plugins("relay", "plugins/testdata/state-relay/plugin.toml");
    let reader = Reader::new(&urls);
    let (_sa, a) = node(&urls, 1, "r1-a", plugins.path());
    let id_a = reader.new_hello(&[]);
    let (_sb, b) = node(&urls, 1, "r1-b", plugins.path());
    let id_b = reader.new_hello(std::slice::from_ref(&id_a));
    reader.until_saw(&[(&id_a, &id_b, "put")], Duration::from_secs(30));
    assert_eq!(reader.stream_info(RELAY_BUCKET).config.num_replicas, 1);

    let holder = reader.leader_of(RELAY_BUCKET, &cluster);
    cluster.stop(holder);
    for n in [&a, &b] {
        assert!(
            watch_is(n, Duration::from_secs(60), |w| w["state"] == "reopening"
                && w["attempts"].as_u64() >= Some(1)
                && w["last_error"].is_string()),
            "{:?}",
            relay_watches(n)
        );
        assert!(
            eventually(
                Duration::from_secs(10),
                || n.health()["plugins"]["watches_reopening"] == 1
            ),
            "{}",
            n.health()
        );
    }

    cluster.restart(holder);
    for n in [&a, &b] {
        assert!(
            watch_is(n, Duration::from_secs(90), |w| w["state"] == "live"
                && w["reopened"].as_u64() >= Some(1)),
            "{:?}",
            relay_watches(n)
        );
    }
    let (_sc, _c) = node(&urls, 1, "r1-c", plugins.path());
    let id_c = reader.new_hello(&[id_a.clone(), id_b.clone()]);
    reader.until_saw(
        &[(&id_a, &id_c, "put"), (&id_b, &id_c, "put")],
        Duration::from_secs(60),
    );
}

/// A module filling its bucket with 256 KiB values is refused at the
/// 64 MiB cap as `bucket-full` (its `init` starts only on that refusal),
/// and the node keeps serving.
#[test]
fn a_module_filling_its_bucket_meets_bucket_full_and_the_node_stays_up() {
    let server = NatsServer::start();
    let urls = vec![server.url()];
    let plugins = plugins("filler", "plugins/testdata/bucket-filler/plugin.toml");
    let (_s, n) = node(&urls, 1, "filler-1", plugins.path());
    let state = || {
        let view = n.get("/plugins").unwrap().json();
        let filler = view["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "filler")
            .cloned()
            .unwrap_or_else(|| panic!("filler loaded: {view}"));
        (filler["state"].clone(), filler["error"].clone())
    };
    assert!(
        eventually(Duration::from_secs(60), || state().0 != "starting"),
        "{:?}",
        state()
    );
    assert_eq!(state().0, "running", "{:?}", state());
    assert!(
        n.log_text().contains("filler: bucket-full after"),
        "{}",
        n.log_text()
    );
    let reader = Reader::new(&urls);
    let bytes = reader.stream_info("mod_filler_blobs").state.bytes;
    assert!(
        (63 << 20..=64 << 20).contains(&bytes),
        "the bucket holds {bytes} bytes"
    );
    assert_eq!(n.get("/ready").map(|r| r.status), Some(200));
    assert_eq!(n.health()["plugins"]["failed"], 0);
}
