//! `[stream.cluster]` through the whole file: what it may sit beside, and
//! the replica count it allows.

use std::path::Path;

use crewlet_config::{NodeConfig, Overrides, StreamMode};

fn parse(text: &str) -> Result<NodeConfig, String> {
    let env = |name: &str| (name == "ROUTE_SECRET").then(|| "s3cret-s3cret-s3cret".to_owned());
    NodeConfig::from_toml(
        "node.toml",
        text,
        Path::new("/etc"),
        &Overrides::default(),
        &env,
    )
    .map_err(|e| e.to_string())
}

const CLUSTER: &str = r#"
[stream.cluster]
name = "acme"
listen = "127.0.0.1:6222"
routes = ["nats-route://127.0.0.1:6222", "nats-route://127.0.0.1:6223", "nats-route://127.0.0.1:6224"]
secret = "${ROUTE_SECRET}"
"#;

#[test]
fn three_embedded_members_hold_three_replicas() {
    let cfg = parse(&format!("[stream]\nreplicas = 3\n{CLUSTER}")).unwrap();
    assert_eq!(cfg.stream.replicas, 3);
    let StreamMode::Embedded(b) = cfg.stream.mode else {
        panic!("embedded")
    };
    let c = b.cluster.expect("a cluster");
    assert_eq!(c.name, "acme");
    assert_eq!(c.secret, "s3cret-s3cret-s3cret", "interpolated");
    assert_eq!(c.known_size(), 3);
}

#[test]
fn more_replicas_than_members_an_external_url_or_local_leases_are_refused() {
    let err = parse(&format!("[stream]\nreplicas = 5\n{CLUSTER}")).unwrap_err();
    assert!(
        err.contains("key `stream.replicas`") && err.contains("at most 3"),
        "{err}"
    );
    let err = parse(&format!("[stream]\nreplicas = 2\n{CLUSTER}")).unwrap_err();
    assert!(err.contains("no quorum"), "{err}");
    let err = parse(&format!("[stream]\nurl = \"nats://a\"\n{CLUSTER}")).unwrap_err();
    assert!(err.contains("key `stream.cluster`"), "{err}");
    let err = parse(&format!("{CLUSTER}\n[coordination]\ntype = \"local\"\n")).unwrap_err();
    assert!(err.contains("key `coordination.type`"), "{err}");
    let err = parse("[stream]\nreplicas = 3\n").unwrap_err();
    assert!(err.contains("[stream.cluster]"), "{err}");
    let err = parse("[stream.cluster]\nlisten = \"127.0.0.1:6222\"\n").unwrap_err();
    assert!(err.contains("key `stream.cluster.name`"), "{err}");
    let err = parse("[stream.cluster]\nname = \"a\"\nport = 1\n").unwrap_err();
    assert!(err.contains("key `stream.cluster.port`"), "{err}");
}
