//! The embedded broker is locked: a real nats-server started by the
//! supervisor refuses a client with no credentials or the wrong ones, and
//! admits the node's own nkey.

use std::time::Duration;

use crewlet_config::{EmbeddedBroker, SyncPolicy};
use crewlet_stream::{BrokerCredential, Supervisor};
use tokio::sync::watch;

fn spec(dir: &std::path::Path) -> EmbeddedBroker {
    EmbeddedBroker {
        store_dir: dir.join("stream"),
        port: 0,
        nats_server: Some(crewlet_testkit::nats_server_bin()),
        sync: SyncPolicy::ServerDefault,
        credential: dir.join("broker.nkey"),
        cluster: None,
    }
}

async fn refused(options: async_nats::ConnectOptions, url: &str) -> String {
    let attempt = tokio::time::timeout(Duration::from_secs(10), options.connect(url))
        .await
        .expect("a refusal comes back at once, not a hang");
    match attempt {
        Ok(_) => panic!("the locked broker admitted a client it should refuse"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn only_the_nodes_own_nkey_gets_in() {
    let dir = tempfile::tempdir().unwrap();
    let (_cancel, cancel_rx) = watch::channel(false);
    let sup = Supervisor::start(&spec(dir.path()), "locked", cancel_rx)
        .await
        .unwrap();
    let url = sup.client_url();
    assert!(url.starts_with("nats://127.0.0.1:"), "{url}");
    let conf = std::fs::read_to_string(dir.path().join("stream/nats-server.conf")).unwrap();
    assert!(conf.contains(sup.credential().public_key()), "{conf}");
    let seed = std::fs::read_to_string(dir.path().join("broker.nkey")).unwrap();
    assert!(
        !conf.contains(seed.trim()),
        "the config holds the public key only"
    );

    let none = refused(async_nats::ConnectOptions::new(), &url).await;
    assert!(none.to_lowercase().contains("authorization"), "{none}");
    let stranger = nkeys::KeyPair::new_user().seed().unwrap();
    let wrong = refused(async_nats::ConnectOptions::with_nkey(stranger), &url).await;
    assert!(wrong.to_lowercase().contains("authorization"), "{wrong}");
    let password = refused(
        async_nats::ConnectOptions::with_user_and_password("crewlet".into(), "guess".into()),
        &url,
    )
    .await;
    assert!(
        password.to_lowercase().contains("authorization"),
        "{password}"
    );

    let own = BrokerCredential::load_or_create(&dir.path().join("broker.nkey")).unwrap();
    let client = own.options().connect(&url).await.unwrap();
    let js = async_nats::jetstream::new(client.clone());
    js.query_account()
        .await
        .expect("the node's own login reaches JetStream");
    drop(client);
    sup.stop().await;
}

/// An external server that wants a user and password: the node's connect
/// options carry Tier A's credentials, and wrong ones stop the start with
/// an error naming the keys instead of retrying forever.
#[tokio::test]
async fn external_credentials_are_carried_and_a_refusal_is_final() {
    use crewlet_config::{NatsAuth, NatsCredentials, StreamConfig, StreamMode};

    let dir = tempfile::tempdir().unwrap();
    let port = crewlet_testkit::free_port();
    let mut cmd = std::process::Command::new(crewlet_testkit::nats_server_bin());
    cmd.args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(dir.path())
        .args(["--user", "fleet", "--pass", "right-password"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut server = crewlet_testkit::nats::spawn_tied(cmd).unwrap();
    let url = format!("nats://127.0.0.1:{port}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    // Polling the port: the server says nothing else when it is ready.
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "nats-server never listened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let config = |password: &str| StreamConfig {
        mode: StreamMode::External {
            urls: vec![url.clone()],
            auth: NatsAuth {
                credentials: Some(NatsCredentials::UserPassword {
                    user: "fleet".into(),
                    password: password.into(),
                }),
                tls: None,
            },
        },
        replicas: 1,
    };
    let (_cancel, cancel_rx) = watch::channel(false);
    let wrong = tokio::time::timeout(
        Duration::from_secs(20),
        crewlet_stream::Broker::start(&config("wrong-password"), "ext", cancel_rx.clone()),
    )
    .await
    .expect("a refusal ends the start, it does not hang");
    let err = wrong
        .err()
        .expect("wrong credentials are refused")
        .to_string();
    assert!(
        err.contains("refused") && err.contains("stream.user"),
        "{err}"
    );
    assert!(!err.contains("wrong-password"), "{err}");

    let broker = crewlet_stream::Broker::start(&config("right-password"), "ext", cancel_rx)
        .await
        .unwrap();
    assert_eq!(broker.health().auth, "user-password");
    assert!(broker.is_connected());
    broker.stop().await;
    let _ = server.kill();
    let _ = server.wait();
}
