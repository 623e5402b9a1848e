//! The applier against a real nats-server and real SQLite files: a retried
//! write applies once, a killed applier resumes at its committed position
//! with no record twice, an undecodable record is kept and counted, a
//! stream recreated underneath stops the domain, and a barrier makes a
//! read see the write before it.

use crate::common;

use std::time::Duration;

use common::{Node, js, raw, recreate_log, tokens, until};
use crewlet_statelog::usage::Usage;
use crewlet_statelog::{Domain, DomainState, Record, ensure_stream};
use crewlet_testkit::NatsServer;

#[tokio::test]
async fn a_retried_write_applies_once_even_after_a_newer_value() {
    let server = NatsServer::start();
    let (_c, js) = js(&server.url()).await;
    let node = Node::new();
    let applier = node.applier(&js, "n1", None, None);
    let first = tokens("n1", "ada", 10);
    let subject = first.subject();
    let written = first.record();
    let p = raw(&js, &subject, written.to_bytes()).await;
    until(&applier, "first value", |s| s.position >= p).await;
    let p = raw(&js, &subject, tokens("n1", "ada", 20).record().to_bytes()).await;
    until(&applier, "newer value", |s| s.position >= p).await;
    assert_eq!(node.input_tokens("n1", "ada"), Some(20));
    // The first write's retry reaches the log after the newer value: the
    // ledger knows its operation, so the older value is not put back.
    let p = raw(&js, &subject, written.to_bytes()).await;
    until(&applier, "the retry", |s| s.position >= p).await;
    assert_eq!(
        node.input_tokens("n1", "ada"),
        Some(20),
        "a retried operation applied twice"
    );
    assert_eq!(node.count("SELECT COUNT(*) FROM statelog_ops"), 2);
    applier.stop().await;
}

#[tokio::test]
async fn a_killed_applier_resumes_at_its_committed_position_with_nothing_twice() {
    let server = NatsServer::start();
    let (_c, js) = js(&server.url()).await;
    let node = Node::new();
    let applier = node.applier(&js, "n1", None, None);
    let publisher = {
        let js = js.clone();
        tokio::spawn(async move {
            let mut last = 0;
            for i in 0..3_000u64 {
                let o = tokens("n1", &format!("seat{i}"), i);
                last = crewlet_statelog::append(&js, &o.subject(), &o.record())
                    .await
                    .unwrap();
            }
            last
        })
    };
    until(&applier, "some applied", |s| s.position >= 300).await;
    // Dropped mid-stream, as a kill would: whatever batch was committing
    // committed whole or not at all.
    applier.stop().await;
    let stopped_at = node.estate.cursor("usage").unwrap().position;
    let last = publisher.await.unwrap();
    assert!(
        stopped_at < last,
        "the applier finished before it was stopped ({stopped_at})"
    );
    let node = Node::open(node.dir);
    let applier = node.applier(&js, "n1", None, None);
    until(&applier, "all applied", |s| s.position >= last).await;
    assert_eq!(node.count("SELECT COUNT(*) FROM usage_tokens"), 3_000);
    assert_eq!(node.count("SELECT COUNT(*) FROM statelog_ops"), 3_000);
    assert_eq!(
        node.count("SELECT SUM(input_tokens) FROM usage_tokens"),
        (0..3_000).sum::<i64>()
    );
    applier.stop().await;
}

#[tokio::test]
async fn a_record_this_build_cannot_decode_is_kept_counted_and_never_applied() {
    let server = NatsServer::start();
    let (_c, js) = js(&server.url()).await;
    let node = Node::new();
    let applier = node.applier(&js, "n1", None, None);
    let newer = br#"{"v":2,"op":"op-newer","kind":"tokens","body":{"whatever":1}}"#.to_vec();
    raw(
        &js,
        "crewlet.usage.log.tokens.n9.2026-12-06.aa",
        newer.clone(),
    )
    .await;
    // A kind this build does not know, and a known kind of another shape.
    let unknown = Record::new("tokens_by_region", serde_json::json!({"node": "n9"}));
    raw(
        &js,
        "crewlet.usage.log.regions.n9.2026-12-06.bb",
        unknown.to_bytes(),
    )
    .await;
    let torn = Record::new(
        "tokens",
        serde_json::json!({"node": "n9", "day": "2026-12-06"}),
    );
    raw(
        &js,
        "crewlet.usage.log.tokens.n9.2026-12-06.cc",
        torn.to_bytes(),
    )
    .await;
    let good = tokens("n1", "ada", 7);
    let p = raw(&js, &good.subject(), good.record().to_bytes()).await;
    let s = until(&applier, "past the bad records", |s| s.position >= p).await;
    assert_eq!(s.ops_lost, 3);
    assert_eq!(node.estate.ops_lost("usage").unwrap(), 3);
    assert_eq!(node.input_tokens("n1", "ada"), Some(7));
    assert_eq!(
        node.count("SELECT COUNT(*) FROM usage_tokens"),
        1,
        "a bad record was applied half"
    );
    let kept: Vec<u8> = node
        .estate
        .reader()
        .unwrap()
        .query_row(
            "SELECT record FROM statelog_ops_lost ORDER BY position LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(kept, newer, "the record is kept whole");
    applier.stop().await;
}

#[tokio::test]
async fn a_stream_recreated_underneath_stops_the_domain_and_applies_nothing_of_it() {
    let server = NatsServer::start();
    let (_c, js) = js(&server.url()).await;
    let node = Node::new();
    let applier = node.applier(&js, "n1", None, None);
    let o = tokens("n1", "ada", 5);
    let p = crewlet_statelog::append(&js, &o.subject(), &o.record())
        .await
        .unwrap();
    until(&applier, "applied", |s| s.position >= p).await;
    js.delete_stream(Usage.stream()).await.unwrap();
    ensure_stream(&js, &Usage, 1).await.unwrap();
    for i in 0..5 {
        let o = tokens("n1", &format!("other{i}"), 99);
        crewlet_statelog::append(&js, &o.subject(), &o.record())
            .await
            .unwrap();
    }
    let s = until(&applier, "diverged", |s| {
        matches!(s.state, DomainState::Diverged { .. })
    })
    .await;
    let DomainState::Diverged { finding, fix } = s.state else {
        unreachable!()
    };
    assert!(finding.found.contains("recreated"), "{}", finding.found);
    assert!(fix.contains("replicated.sqlite3"), "{fix}");
    assert_eq!(
        node.count("SELECT COUNT(*) FROM usage_tokens"),
        1,
        "the other history was applied"
    );
    applier.stop().await;
    // A restart stays stopped: the finding is on disk.
    let applier = node.applier(&js, "n1", None, None);
    until(&applier, "still diverged", |s| {
        matches!(s.state, DomainState::Diverged { .. })
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(node.count("SELECT COUNT(*) FROM usage_tokens"), 1);
    applier.stop().await;
}

#[tokio::test]
async fn a_barrier_makes_the_read_after_it_see_every_acknowledged_write() {
    let server = NatsServer::start();
    let (_c, js) = js(&server.url()).await;
    let node = Node::new();
    let applier = node.applier(&js, "n1", None, None);
    until(&applier, "started", |s| s.state == DomainState::Applying).await;
    let o = tokens("n2", "bob", 42);
    crewlet_statelog::append(&js, &o.subject(), &o.record())
        .await
        .unwrap();
    applier.barrier(Duration::from_secs(10)).await.unwrap();
    assert_eq!(node.input_tokens("n2", "bob"), Some(42));
    applier.stop().await;
}

/// A broker restored from an older copy, seen by a node that lost its
/// own record of the stream's identity: a log ending below the node's
/// position, or another record at its checkpoint, stops the domain.
#[tokio::test]
async fn a_log_restored_from_an_older_copy_stops_the_domain_even_unrecognised() {
    let server = NatsServer::start();
    let (_c, js) = js(&server.url()).await;
    let node = Node::new();
    let applier = node.applier(&js, "n1", None, None);
    let mut last = 0;
    for i in 0..4 {
        let o = tokens("n1", &format!("s{i}"), i);
        last = crewlet_statelog::append(&js, &o.subject(), &o.record())
            .await
            .unwrap();
    }
    until(&applier, "applied", |s| s.position >= last).await;
    applier.stop().await;
    let forget_identity = |node: &Node| {
        let c = rusqlite::Connection::open(node.path().join(crewlet_statelog::LOCAL_FILE)).unwrap();
        c.execute("DELETE FROM stream_identity", []).unwrap();
    };

    // The older copy holds two records: it ends below the position.
    recreate_log(&js).await;
    for i in 0..2 {
        let o = tokens("n1", &format!("old{i}"), 9);
        crewlet_statelog::append(&js, &o.subject(), &o.record())
            .await
            .unwrap();
    }
    forget_identity(&node);
    let applier = node.applier(&js, "n1", None, None);
    let s = until(&applier, "diverged", |s| {
        matches!(s.state, DomainState::Diverged { .. })
    })
    .await;
    let DomainState::Diverged { finding, .. } = s.state else {
        unreachable!()
    };
    assert!(
        finding.found.contains("below this node's position"),
        "{}",
        finding.found
    );
    applier.stop().await;

    // Another node, same story but the copy reaches past its position:
    // another record sits at the checkpoint.
    let other = Node::new();
    recreate_log(&js).await;
    let first = other.applier(&js, "n2", None, None);
    for i in 0..3 {
        let o = tokens("n2", &format!("a{i}"), 1);
        last = crewlet_statelog::append(&js, &o.subject(), &o.record())
            .await
            .unwrap();
    }
    until(&first, "applied", |s| s.position >= last).await;
    first.stop().await;
    recreate_log(&js).await;
    for i in 0..5 {
        let o = tokens("n2", &format!("b{i}"), 2);
        crewlet_statelog::append(&js, &o.subject(), &o.record())
            .await
            .unwrap();
    }
    forget_identity(&other);
    let again = other.applier(&js, "n2", None, None);
    let s = until(&again, "diverged", |s| {
        matches!(s.state, DomainState::Diverged { .. })
    })
    .await;
    let DomainState::Diverged { finding, .. } = s.state else {
        unreachable!()
    };
    assert!(
        finding.found.contains("another record sits at position 3"),
        "{}",
        finding.found
    );
    assert_eq!(
        other.count("SELECT COUNT(*) FROM usage_tokens WHERE seat LIKE 'b%'"),
        0
    );
    again.stop().await;
}
