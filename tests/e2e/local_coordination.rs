//! `coordination.type = "local"` is for one node: a second such node on the
//! same broker is refused at start (exit 2), naming the first and the key.

use std::time::Duration;

use crate::common::{NodeBuilder, Sandbox};
use crewlet_testkit::NatsServer;

fn local_node(server: &NatsServer, id: &str) -> (Sandbox, NodeBuilder) {
    let sb = Sandbox::new();
    let b = sb.fleet_node(id, &[server.url()], "[coordination]\ntype = \"local\"\n");
    (sb, b)
}

#[test]
fn a_second_node_with_local_coordination_on_one_broker_is_refused() {
    let server = NatsServer::start();
    let (_sa, a) = local_node(&server, "local-a");
    let mut a = a.spawn();
    a.wait_ready(Duration::from_secs(60));

    let (_sb, b) = local_node(&server, "local-b");
    let mut b = b.spawn();
    let status = b.wait_exit(Duration::from_secs(60));
    let log = b.log_text();
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("node local-a already runs with local coordination")
            && log.contains("coordination.type"),
        "{log}"
    );
    assert!(
        a.log_text()
            .contains("another node with local coordination asked"),
        "{}",
        a.log_text()
    );
    // The first node is unharmed, and a node alone starts as before.
    assert!(crate::common::alive(a.pid()), "{}", a.log_text());
    assert_eq!(a.health()["node_id"], "local-a");
    a.signal(libc::SIGTERM);
    assert!(a.wait_exit(Duration::from_secs(30)).success());
    let (_sc, c) = local_node(&server, "local-c");
    let mut c = c.spawn();
    c.wait_ready(Duration::from_secs(60));
}
