//! The reconciler every node runs, against the in-memory coordination twin
//! (one twin shared by two nodes is one fleet): a `--company` seed only
//! onto an unset pointer, every node applying what the pointer names, and
//! an unreadable pointer keeping the company served (`isolated`), never
//! taken for "unset". Events go to a real nats-server with no stream: a
//! broadcast that cannot be made is logged, never fatal.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crewlet_company::{ActiveCompany, Company};
use crewlet_configplane::{Parts, Plane, Posture, PostureReport, Postures, Running, Seed, start};
use crewlet_coord::{Coord, CoordOptions, Faulty, Owner, Pointer};
use crewlet_observe::Publisher;
use crewlet_store::Store;
use crewlet_testkit::NatsServer;

const EXAMPLE: &str = include_str!("../../../examples/company.toml");

fn doc(org: &str) -> (String, Company) {
    let text = EXAMPLE.replace("name = \"Acme Robotics\"", &format!("name = \"{org}\""));
    let company = Company::parse(&text).expect("the example parses");
    (text, company)
}

fn twin() -> (Arc<Faulty>, Coord) {
    Coord::breakable_memory(CoordOptions::new(Owner::incarnation("configplane-test")))
}

/// Where a test node shows its posture.
#[derive(Default)]
struct Board(Mutex<Option<PostureReport>>);

impl Postures for Board {
    fn set_posture(&self, report: PostureReport) -> bool {
        let mut now = self.0.lock().unwrap();
        let changed = now.as_ref().map(|r| r.posture) != Some(report.posture);
        *now = Some(report);
        changed
    }

    fn posture(&self) -> Posture {
        self.0
            .lock()
            .unwrap()
            .as_ref()
            .map_or(Posture::Wait, |r| r.posture)
    }
}

struct Node {
    id: String,
    active: ActiveCompany,
    board: Arc<Board>,
    publisher: Publisher,
    running: Running,
    _dir: tempfile::TempDir,
}

/// A node started with `seed` as its `--company` document (written to its
/// data dir, as the reconciler reads it again at start).
async fn node(
    id: &str,
    coord: &Coord,
    server: &NatsServer,
    seed: Option<(&str, &Company)>,
) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open_in(dir.path()).unwrap());
    let client = async_nats::connect(server.url()).await.expect("connect");
    let publisher = Publisher::new(id, store.clone(), async_nats::jetstream::new(client));
    let seed = seed.map(|(text, company)| {
        let path = dir.path().join("company.toml");
        std::fs::write(&path, text).unwrap();
        Seed {
            path,
            company: company.clone(),
            activate: false,
        }
    });
    let active = ActiveCompany::new(None);
    let board = Arc::new(Board::default());
    let running = start(Parts {
        node_id: id.into(),
        pointer: coord.config_pointer(),
        store,
        publisher: publisher.clone(),
        active: active.clone(),
        postures: board.clone(),
        accept: Arc::new(|document: &str| Company::parse(document)),
        seed,
        client: None,
    })
    .await;
    Node {
        id: id.into(),
        active,
        board,
        publisher,
        running,
        _dir: dir,
    }
}

/// Waits (well past the 2 s poll) until `done` holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "{what} within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn org(n: &Node) -> Option<String> {
    n.active.current().map(|a| a.company.org.clone())
}

#[tokio::test]
async fn the_first_node_seeds_the_pointer_and_a_joining_node_follows_the_fleet() {
    let server = NatsServer::start();
    let (_f, coord) = twin();
    let (a_text, a_doc) = doc("A");
    let first = node("n1", &coord, &server, Some((&a_text, &a_doc))).await;
    // The first poll runs inside start: seeded and applied at once.
    let Pointer::Set { revision, epoch } = coord.active_config().await.unwrap() else {
        panic!("the --company document seeds an unset pointer");
    };
    assert_eq!(revision, a_doc.digest);
    assert_eq!(first.active.applied_epoch(), Some(epoch));
    assert_eq!(first.board.posture(), Posture::Serve);

    // A node started with another document follows the fleet's revision.
    let (b_text, b_doc) = doc("B");
    let joining = node("n2", &coord, &server, Some((&b_text, &b_doc))).await;
    assert_eq!(org(&joining).as_deref(), Some("A"), "follows the fleet");
    assert_eq!(
        coord.active_config().await.unwrap(),
        Pointer::Set {
            revision: a_doc.digest.clone(),
            epoch
        },
        "a joining node's --company never overwrites the pointer"
    );

    // An operator's PUT through one node is applied by every node.
    let plane = Plane::new(
        first.id.clone(),
        coord.config_pointer(),
        first.publisher.clone(),
        first.active.clone(),
    );
    let put = plane.put(&b_doc, &b_text).await.expect("activated");
    assert!(put.moved && put.epoch > epoch, "{put:?}");
    for n in [&first, &joining] {
        until("every node applies the new epoch", || {
            n.active.applied_epoch() == Some(put.epoch)
        })
        .await;
        assert_eq!(org(n).as_deref(), Some("B"));
    }
    // GET /config's body: the revision, and every node's word on it.
    let body = plane.active().await.unwrap().expect("a revision is active");
    assert_eq!(body["epoch"], put.epoch.get());
    assert_eq!(body["org"], "B");
    assert_eq!(body["applied"], true);
    let fleet = body["fleet"].as_array().expect("the fleet is readable");
    assert_eq!(fleet.len(), 2, "{body}");
    for n in [first, joining] {
        n.running.stop().await;
    }
}

#[tokio::test]
async fn an_unreadable_pointer_is_isolated_and_keeps_the_company_served() {
    let server = NatsServer::start();
    let (faulty, coord) = twin();
    let (a_text, a_doc) = doc("A");
    let n = node("n1", &coord, &server, Some((&a_text, &a_doc))).await;
    let epoch = n.active.applied_epoch().expect("applied at start");
    faulty.break_store();
    until("the posture turns isolated", || {
        n.board.posture() == Posture::Isolated
    })
    .await;
    assert_eq!(n.active.applied_epoch(), Some(epoch), "still serving it");
    let plane = Plane::new(
        n.id.clone(),
        coord.config_pointer(),
        n.publisher.clone(),
        n.active.clone(),
    );
    let err = plane.active().await.expect_err("unknown is not unset");
    assert!(
        matches!(err, crewlet_configplane::ConfigError::Unavailable(_)),
        "{err}"
    );
    faulty.heal();
    until("the posture serves again", || {
        n.board.posture() == Posture::Serve
    })
    .await;
    n.running.stop().await;
}

#[tokio::test]
async fn nothing_activated_is_no_revision_not_an_error() {
    let server = NatsServer::start();
    let (_f, coord) = twin();
    let n = node("n1", &coord, &server, None).await;
    assert_eq!(n.board.posture(), Posture::Serve, "nothing to be behind");
    assert_eq!(org(&n), None);
    let plane = Plane::new(
        n.id.clone(),
        coord.config_pointer(),
        n.publisher.clone(),
        n.active.clone(),
    );
    assert_eq!(plane.active().await.unwrap(), None);
    n.running.stop().await;
}
