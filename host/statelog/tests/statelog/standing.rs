//! A node's standing on the state log, against a real nats-server: an
//! evicted node that comes back applies nothing and publishes no position
//! until an operator readmits it, then adopts a peer's snapshot past the
//! trim and replays; a donor that cannot give a snapshot (diverged, or
//! below the trim's floor) answers why, and the adopter asks the next peer.

use crate::common;

use common::{Node, adopter, book, js, published, serve, tokens, until};
use crewlet_statelog::usage::Usage;
use crewlet_statelog::{
    Applier, Diverged, DomainState, DomainStatus, Eviction, PositionBook, append, trim,
};
use crewlet_testkit::NatsServer;

async fn append_n(js: &async_nats::jetstream::Context, from: u64, n: u64) -> u64 {
    let mut last = 0;
    for i in from..from + n {
        let o = tokens("n1", &format!("s{i}"), i);
        last = append(js, &o.subject(), &o.record()).await.unwrap();
    }
    last
}

async fn trim_to(js: &async_nats::jetstream::Context, book: &PositionBook, floor: u64) {
    let t = trim::trim(js, book, &Usage, "n1").await.unwrap();
    assert_eq!(t.map(|t| t.floor), Some(floor), "the trim's floor");
}

/// Waits until `applier` applies at `position` or past, having adopted
/// n1's snapshot (its only adoption), with `rows` token rows.
async fn adopted_from_n1(applier: &Applier, node: &Node, position: u64, rows: i64) {
    until(applier, "adopted", |s| {
        s.position >= position && s.state == DomainState::Applying
    })
    .await;
    assert_eq!(
        node.local.adoptions().unwrap(),
        vec![("n1".to_owned(), "installed".to_owned())]
    );
    assert_eq!(node.count("SELECT COUNT(*) FROM usage_tokens"), rows);
}

/// A broker and donor n1, serving its estate while its applier applies.
struct OneDonor {
    _server: NatsServer,
    _a: Node,
    _serving: tokio::task::JoinHandle<()>,
    client: async_nats::Client,
    js: async_nats::jetstream::Context,
    book: PositionBook,
    donor: Applier,
}

async fn one_donor() -> OneDonor {
    let server = NatsServer::start();
    let (client, js) = js(&server.url()).await;
    let book = book(&client, "n1").await;
    let a = Node::new();
    let donor = a.applier(&js, "n1", Some(book.clone()), None);
    let serving = serve(&client, &js, &a, "n1", Some(book.clone()), &donor).await;
    OneDonor {
        _server: server,
        _a: a,
        _serving: serving,
        client,
        js,
        book,
        donor,
    }
}

#[tokio::test]
async fn an_evicted_node_applies_nothing_until_readmitted_then_adopts_past_the_trim() {
    let fleet = one_donor().await;
    let (client, js, book, donor) = (&fleet.client, &fleet.js, &fleet.book, &fleet.donor);
    let b = Node::new();
    let joiner = b.applier(js, "n2", Some(book.clone()), None);
    let first = append_n(js, 0, 10).await;
    until(&joiner, "n2 applied", |s| s.position >= first).await;
    published(book, "n2", first).await;
    joiner.stop().await;

    // n2 is gone; an operator evicts it, and the trim passes it.
    book.evict(&Eviction {
        node: "n2".into(),
        by: "ops".into(),
        reason: "disk lost".into(),
        at_ms: 1,
    })
    .await
    .unwrap();
    let second = append_n(js, 10, 10).await;
    until(donor, "n1 applied", |s| s.position >= second).await;
    published(book, "n1", second).await;
    trim_to(js, book, second).await;

    // n2 comes back: refused, saying how to readmit it.
    let back = b.applier(
        js,
        "n2",
        Some(book.clone()),
        Some(adopter(client, js, book, &b, "n2")),
    );
    let s = until(&back, "refused", |s| {
        matches!(s.state, DomainState::Evicted { .. })
    })
    .await;
    let DomainState::Evicted { fix, eviction } = &s.state else {
        unreachable!()
    };
    assert!(fix.contains("crewlet estate readmit n2"), "{fix}");
    assert_eq!(eviction.reason, "disk lost");
    let third = append_n(js, 20, 1).await;
    until(donor, "n1 applied", |s| s.position >= third).await;
    // Another pass of its loop comes and goes: still nothing applied,
    // nothing published.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert_eq!(back.status().position, first);
    assert!(matches!(back.status().state, DomainState::Evicted { .. }));
    assert_eq!(
        book.positions("usage").await.unwrap().get("n2"),
        Some(&first)
    );
    assert_eq!(b.input_tokens("n1", "s20"), None);

    // Readmitted: it adopts n1's snapshot (the log lost what it needs)
    // and replays from there.
    let ended = book.readmit("n2").await.unwrap();
    assert_eq!(ended.map(|e| e.reason), Some("disk lost".to_owned()));
    assert_eq!(book.readmit("n2").await.unwrap(), None, "readmitted once");
    adopted_from_n1(&back, &b, third, 21).await;
    let fourth = append_n(js, 21, 1).await;
    until(&back, "replayed", |s| s.position >= fourth).await;
    published(book, "n2", fourth).await;
    back.stop().await;
    donor.stop().await;
}

#[tokio::test]
async fn a_donor_that_cannot_donate_says_why_and_the_adopter_asks_the_next_peer() {
    let fleet = one_donor().await;
    let (client, js, book, donor) = (&fleet.client, &fleet.js, &fleet.book, &fleet.donor);
    let last = append_n(js, 0, 20).await;
    until(donor, "n1 applied", |s| s.position >= last).await;
    published(book, "n1", last).await;

    // n3 publishes the furthest position, but its log diverged; n4 applies
    // but stands below the floor.
    let status = |position: u64, state: DomainState| {
        tokio::sync::watch::channel(DomainStatus {
            domain: "usage".into(),
            position,
            ops_lost: 0,
            state,
        })
    };
    let diverged = DomainState::Diverged {
        finding: Diverged {
            domain: "usage".into(),
            stream: "CREWLET_USAGE_LOG".into(),
            position: last + 100,
            found: "stream recreated".into(),
            found_ms: 1,
        },
        fix: "operator".into(),
    };
    let (_d_tx, d_rx) = status(last + 100, diverged);
    let (_l_tx, l_rx) = status(1, DomainState::Applying);
    let mut standing = Vec::new();
    for (name, rx) in [("n3", d_rx), ("n4", l_rx)] {
        let node = Node::new();
        let served = crewlet_statelog::snapshot::serve(crewlet_statelog::snapshot::Donor {
            client: client.clone(),
            js: js.clone(),
            estate: node.estate.clone(),
            node: name.into(),
            staging: node.path().to_path_buf(),
            book: Some(book.clone()),
            domains: vec![rx],
        })
        .await
        .unwrap();
        standing.push((node, served));
    }
    book.publish("usage", "n3", last + 100).await.unwrap();
    trim_to(js, book, last).await;

    let ask = |name: &'static str| {
        let client = client.clone();
        async move {
            let r = client
                .request(crewlet_bus::snapshot_subject(name), "probe".into())
                .await
                .unwrap();
            String::from_utf8_lossy(&r.payload).into_owned()
        }
    };
    let why = ask("n3").await;
    assert!(
        why.contains("cannot give a snapshot") && why.contains("diverged"),
        "{why}"
    );
    let why = ask("n4").await;
    assert!(why.contains("below the trim's floor"), "{why}");

    // A joiner below the floor asks n3 first (furthest along), is told
    // why not, and adopts n1's.
    let b = Node::new();
    let joiner = b.applier(
        js,
        "n2",
        Some(book.clone()),
        Some(adopter(client, js, book, &b, "n2")),
    );
    adopted_from_n1(&joiner, &b, last, 20).await;
    joiner.stop().await;
    donor.stop().await;
}
