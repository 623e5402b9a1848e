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
