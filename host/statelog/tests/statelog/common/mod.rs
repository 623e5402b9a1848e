//! What the crate tests share: a real nats-server, real estate files, an
//! applier of the usage domain, and a wait on a condition.

#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use crewlet_coord::{Coord, CoordOptions, Owner};
use crewlet_statelog::snapshot::{self, Adopter, Donor};
use crewlet_statelog::usage::{TokensObject, Usage, UsageObject};
use crewlet_statelog::{Applier, ApplierParts, Domain, DomainStatus, Estate, Local, PositionBook};

pub struct Node {
    pub dir: tempfile::TempDir,
    pub estate: Arc<Estate>,
    pub local: Arc<Local>,
}

impl Node {
    pub fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        Node::open(dir)
    }

    pub fn open(dir: tempfile::TempDir) -> Node {
        let estate = Arc::new(Estate::open_in(dir.path()).unwrap());
        let local = Arc::new(Local::open_in(dir.path()).unwrap());
        Node { dir, estate, local }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn applier(
        &self,
        js: &jetstream::Context,
        name: &str,
        book: Option<PositionBook>,
        adopter: Option<Adopter>,
    ) -> Applier {
        Applier::start(ApplierParts {
            js: js.clone(),
            estate: self.estate.clone(),
            local: self.local.clone(),
            domain: Arc::new(Usage),
            book,
            adopter,
            node: name.into(),
            replicas: 1,
        })
    }

    /// One column of one usage_tokens row, read as a reader would.
    pub fn input_tokens(&self, node: &str, seat: &str) -> Option<i64> {
        let conn = self.estate.reader().unwrap();
        conn.query_row(
            "SELECT input_tokens FROM usage_tokens WHERE node = ?1 AND seat = ?2",
            [node, seat],
            |r| r.get(0),
        )
        .ok()
    }

    pub fn count(&self, sql: &str) -> i64 {
        self.estate
            .reader()
            .unwrap()
            .query_row(sql, [], |r| r.get(0))
            .unwrap()
    }
}

pub async fn js(url: &str) -> (async_nats::Client, jetstream::Context) {
    let client = async_nats::connect(url).await.unwrap();
    let js = jetstream::new(client.clone());
    crewlet_statelog::ensure_stream(&js, &Usage, 1)
        .await
        .unwrap();
    (client, js)
}

pub async fn book(client: &async_nats::Client, node: &str) -> PositionBook {
    let coord = Coord::open(client.clone(), CoordOptions::new(Owner::incarnation(node)))
        .await
        .unwrap();
    PositionBook::new(coord)
}

pub fn tokens(node: &str, seat: &str, input: u64) -> UsageObject {
    UsageObject::Tokens(TokensObject {
        node: node.into(),
        day: "2026-12-06".into(),
        seat: seat.into(),
        role: "eng".into(),
        phase: "executor".into(),
        model: "m1".into(),
        slot: None,
        calls: 1,
        input_tokens: input,
        output_tokens: 1,
    })
}

/// Publishes raw bytes on `subject` with no message id (a retry the
/// stream's duplicate window no longer covers); answers the position.
pub async fn raw(js: &jetstream::Context, subject: &str, bytes: Vec<u8>) -> u64 {
    js.publish(subject.to_owned(), bytes.into())
        .await
        .unwrap()
        .await
        .unwrap()
        .sequence
}

/// Deletes the usage log and makes it again, empty: the test's "broker
/// restored from an older copy". A log made again at once after its delete
/// was answered can come back holding the deleted one's records (seen
/// here with the file store: the new log showed the old three), so it
/// deletes and makes it again until the new one is empty (bounded: 10 s).
pub async fn recreate_log(js: &jetstream::Context) -> jetstream::stream::Stream {
    let name = Usage.stream();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let _ = js.delete_stream(name).await;
        if js.get_stream(name).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        } else {
            let mut stream = crewlet_statelog::ensure_stream(js, &Usage, 1)
                .await
                .unwrap();
            let state = stream.info().await.unwrap().state.clone();
            if state.messages == 0 && state.last_sequence == 0 {
                return stream;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} not made again empty within 10 s"
        );
    }
}

/// Waits (up to 20 s) until the applier's status satisfies `cond`.
pub async fn until(
    applier: &Applier,
    what: &str,
    cond: impl Fn(&DomainStatus) -> bool,
) -> DomainStatus {
    let mut rx = applier.watch();
    match tokio::time::timeout(Duration::from_secs(20), rx.wait_for(|s| cond(s))).await {
        Ok(Ok(s)) => s.clone(),
        _ => panic!("{what}: not within 20 s; status {:?}", applier.status()),
    }
}

/// Serves `node`'s estate as donor `name`, offering while `applier` applies.
pub async fn serve(
    client: &async_nats::Client,
    js: &jetstream::Context,
    node: &Node,
    name: &str,
    book: Option<PositionBook>,
    applier: &Applier,
) -> tokio::task::JoinHandle<()> {
    snapshot::serve(Donor {
        client: client.clone(),
        js: js.clone(),
        estate: node.estate.clone(),
        node: name.into(),
        staging: node.path().to_path_buf(),
        book,
        domains: vec![applier.watch()],
    })
    .await
    .unwrap()
}

/// An adopter for `name`, staging in `node`'s dir.
pub fn adopter(
    client: &async_nats::Client,
    js: &jetstream::Context,
    book: &PositionBook,
    node: &Node,
    name: &str,
) -> Adopter {
    Adopter {
        client: client.clone(),
        js: js.clone(),
        book: book.clone(),
        node: name.into(),
        staging: node.path().to_path_buf(),
    }
}

/// Waits (up to 20 s) until `name`'s published position on `usage` is
/// `position`.
pub async fn published(book: &PositionBook, name: &str, position: u64) {
    let waited = tokio::time::timeout(Duration::from_secs(20), async {
        while book.positions("usage").await.unwrap().get(name) != Some(&position) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{name} never published position {position}");
}
