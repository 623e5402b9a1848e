//! The token mirror against the in-memory coordination twin: the first
//! start makes one admin token (written 0600 beside the node), a token
//! issued or revoked anywhere is judged so here, and a mirror cut off from
//! the bucket fails closed for what it has not seen.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crewlet_coord::{Coord, CoordOptions, Faulty, Owner};
use crewlet_tokens::{Standing, TOKEN_FILE, Tokens};
use tokio::sync::watch;

fn twin() -> (Arc<Faulty>, Coord) {
    Coord::breakable_memory(CoordOptions::new(Owner::incarnation("tokens-test")))
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what} within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn first_start_issue_and_revoke_reach_the_mirror() {
    let (_f, coord) = twin();
    let tokens = Arc::new(Tokens::default());
    assert!(
        matches!(tokens.check("anything"), Standing::Unknown(_)),
        "unknown until listed"
    );
    let (stop, stopped) = watch::channel(false);
    tokens
        .start(coord.token_records(), stopped, Duration::from_secs(5))
        .await;
    assert_eq!(tokens.check("anything"), Standing::NotHeld);

    let dir = tempfile::tempdir().unwrap();
    let (admin, seeded) = tokens
        .bootstrap(dir.path())
        .await
        .expect("the bucket answers")
        .expect("no admin token yet: one is made");
    assert!(!seeded);
    let file = dir.path().join(TOKEN_FILE);
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), admin);
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(matches!(tokens.check(&admin), Standing::Live { ref scope, .. } if scope == "admin"));
    assert_eq!(
        tokens.bootstrap(dir.path()).await.unwrap(),
        None,
        "a live admin token exists: none is made again"
    );

    // Issued through another node's mirror, judged here once it arrives.
    let peer = Arc::new(Tokens::default());
    let (_peer_stop, peer_stopped) = watch::channel(false);
    peer.start(coord.token_records(), peer_stopped, Duration::from_secs(5))
        .await;
    let made = peer
        .issue("read", "ci".into(), Some(3600))
        .await
        .expect("issued");
    let value = made["token"].as_str().unwrap().to_owned();
    let id = made["id"].as_str().unwrap().to_owned();
    until("the new token reaches this node's mirror", || {
        matches!(tokens.check(&value), Standing::Live { .. })
    })
    .await;
    let listed = tokens.list().await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(
        listed
            .iter()
            .all(|t| t.get("token").is_none() && t.get("hash").is_none()),
        "a listing never shows a value or a hash: {listed:?}"
    );

    assert!(peer.revoke(&id).await.unwrap().is_some());
    until("the revocation reaches this node's mirror", || {
        tokens.check(&value) == Standing::Revoked
    })
    .await;
    assert_eq!(peer.revoke("no-such-id").await.unwrap(), None);
    let _ = stop.send(true);
}
