//! Leases judged on the broker's clock, through the real binary: two nodes
//! on one nats-server, one whose wall clock runs a minute ahead and one a
//! minute behind (`CREWLET_TEST_CLOCK_OFFSET_MS`, which shifts only the
//! node's wall clock). Their seats stay with their holders, at the same
//! epoch, for three lease TTLs — the node ahead takes nothing live, the one
//! behind loses nothing; and when the node ahead is killed, the one behind
//! takes its seats (and the scheduler duty it held) after the
//! deadline and within a few seconds of it, not a minute late.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use crewlet_testkit::{NatsServer, PluginsDir, free_port};

/// The seat lease TTL (`coordination.lease_ttl_seconds`).
const TTL: Duration = Duration::from_secs(6);
/// The scheduler duty's TTL (`duties.scheduler_lease_seconds`).
const DUTY_TTL: Duration = Duration::from_secs(4);
const SEATS: [&str; 4] = ["ada", "bob", "cyd", "dee"];

const COMPANY: &str = r#"
[org]
name = "Acme"
[roles.support]
system_prompt = "You answer questions in chat."
executor = [{ provider = "scripted", model = "demo", options = { steps = [
  { call = "submit_work", args = { outcome = "delivered", summary = "done" } },
] } }]
reviewer = { provider = "scripted", model = "demo-review", options = { steps = [
  { call = "submit_review", args = { verdict = "done" } },
] } }
[seats]
ada = { role = "support", group = "day" }
bob = { role = "support", group = "day" }
cyd = { role = "support", group = "day" }
dee = { role = "support", group = "day" }
"#;

fn spawn(sb: &Sandbox, server: &NatsServer, id: &str, offset_ms: i64, company: &Sandbox) -> Node {
    let port = free_port();
    let cfg = sb.config(
        port,
        &format!(
            "[node]\nid = \"{id}\"\n[stream]\nurl = \"{}\"\n[coordination]\nlease_ttl_seconds = {}\nheartbeat_seconds = 1\n[duties]\nscheduler_lease_seconds = {}\n",
            server.url(),
            TTL.as_secs(),
            DUTY_TTL.as_secs()
        ),
    );
    NodeBuilder::new(sb, port)
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(sb.data_dir())
        .arg("--company")
        .arg(company.path("company.toml"))
        .arg("--plugins")
        .arg(company.path("plugins"))
        .env(crewlet_os::TEST_CLOCK_OFFSET_ENV, offset_ms.to_string())
        .spawn()
}

/// Seat → (holder node, epoch, state), as `node` sees it.
fn seats(node: &Node) -> BTreeMap<String, (String, u64, String)> {
    let r = node.get("/agents").expect("GET /agents");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["handle"].as_str().unwrap().to_owned(),
                (
                    a["holder"]["node"].as_str().unwrap_or("-").to_owned(),
                    a["holder"]["epoch"].as_u64().unwrap_or(0),
                    a["state"].as_str().unwrap().to_owned(),
                ),
            )
        })
        .collect()
}

/// Seat → (holder, epoch): what must not change while both nodes live.
fn tenures(view: &BTreeMap<String, (String, u64, String)>) -> BTreeMap<String, (String, u64)> {
    view.iter()
        .map(|(s, (n, e, _))| (s.clone(), (n.clone(), *e)))
        .collect()
}

/// Whether `node` holds the scheduler duty, by its own `/health`.
fn holds_scheduler(node: &Node) -> bool {
    node.get("/health").is_some_and(|r| {
        r.json()["duties"]["held_here"]
            .as_array()
            .is_some_and(|rows| rows.iter().any(|r| r["duty"] == "scheduler"))
    })
}

#[test]
fn skewed_clocks_neither_steal_nor_lose_a_lease_and_a_killed_holder_is_taken_over_in_time() {
    let begun = Instant::now();
    let server = NatsServer::start();
    let shared = Sandbox::new();
    std::fs::write(shared.path("company.toml"), COMPANY).unwrap();
    PluginsDir::new(shared.path("plugins"))
        .add("scripted", "plugins/providers/scripted/plugin.toml");
    let (sb_ahead, sb_behind) = (Sandbox::new(), Sandbox::new());
    let mut ahead = spawn(&sb_ahead, &server, "ahead", 60_000, &shared);
    ahead.wait_ready(Duration::from_secs(60));
    // The node ahead takes the scheduler first, so its death is a duty
    // the node behind must take in time as well.
    assert!(
        eventually(Duration::from_secs(15), || holds_scheduler(&ahead)),
        "the first node never took the scheduler duty"
    );
    let mut behind = spawn(&sb_behind, &server, "behind", -60_000, &shared);
    behind.wait_ready(Duration::from_secs(60));

    // Two seats each, every one held.
    let mut view = BTreeMap::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            view = seats(&behind);
            let on = |n: &str| view.values().filter(|(h, _, _)| h == n).count();
            view.values().all(|(_, _, s)| s == "held") && on("ahead") == 2 && on("behind") == 2
        }),
        "seats never spread two and two: {view:?}"
    );
    let settled = tenures(&view);
    assert!(holds_scheduler(&ahead) && !holds_scheduler(&behind));
    eprintln!(
        "clock_skew: spread after {:?}: {settled:?}",
        begun.elapsed()
    );

    // Three TTLs: no seat changes holder or epoch, seen from either node;
    // the scheduler stays where it was.
    let hold_until = Instant::now() + 3 * TTL;
    while Instant::now() < hold_until {
        for n in [&ahead, &behind] {
            let now = tenures(&seats(n));
            assert_eq!(now, settled, "a seat changed hands while both nodes live");
        }
        assert!(
            holds_scheduler(&ahead) && !holds_scheduler(&behind),
            "the scheduler duty moved while both nodes live"
        );
        // The pace of a reader; leases beat every second.
        std::thread::sleep(Duration::from_millis(500));
    }

    // The node ahead dies; the node behind (a minute slow) takes its seats
    // once their leases lapse — not before, and not a minute late.
    ahead.signal(libc::SIGKILL);
    let killed = Instant::now();
    ahead.wait_exit(Duration::from_secs(10));
    let mut last = BTreeMap::new();
    assert!(
        eventually(TTL + Duration::from_secs(6), || {
            last = seats(&behind);
            last.values().all(|(h, _, s)| h == "behind" && s == "held")
        }),
        "the node behind did not take the killed node's seats within {:?}: {last:?}\n{}",
        TTL + Duration::from_secs(6),
        behind.log_text()
    );
    let took = killed.elapsed();
    eprintln!("clock_skew: seats taken over {took:?} after the kill");
    // Its last renew was about half a heartbeat (0.5 s) before the kill;
    // two heartbeats of slack for a loaded machine. Taken on the node's
    // clock a minute ahead, they moved at once.
    assert!(
        took >= TTL - Duration::from_secs(2),
        "seats taken {took:?} after the kill: before their leases lapsed"
    );
    for (seat, (_, epoch, _)) in &last {
        if settled[seat].0 == "ahead" {
            assert!(*epoch > settled[seat].1, "{seat}: {last:?}");
        }
    }
    // The duty's TTL is shorter than the seats': it lapsed by now.
    assert!(
        eventually(Duration::from_secs(3), || holds_scheduler(&behind)),
        "the node behind never took the scheduler duty"
    );
    assert_eq!(SEATS.len(), last.len());
    eprintln!("clock_skew: whole test {:?}", begun.elapsed());
}
