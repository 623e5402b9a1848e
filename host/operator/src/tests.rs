//! The catalogue's tools against the in-memory coordination twin (seat
//! leases, pause records: breakable, so unknown can be shown), a real
//! nats-server for the broadcast and the history read, and a real store.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crewlet_company::{Active, ActiveCompany, Company};
use crewlet_coord::{Bucket, Coord, CoordOptions, Faulty, Owner};
use crewlet_testkit::NatsServer;

use super::*;

/// `examples/company.toml` (seats ada and grace among them).
fn example_company() -> Company {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    Company::parse(&std::fs::read_to_string(root.join("examples/company.toml")).unwrap()).unwrap()
}

/// The node's side of the catalogue, as the node's adapter gives it.
struct Desk {
    up: Option<Up>,
    draining: AtomicBool,
}

struct Up {
    client: async_nats::Client,
    coord: Coord,
    store: Arc<crewlet_store::Store>,
    edge: Arc<Edge>,
    active: ActiveCompany,
}

impl Engine for Desk {
    fn parts(&self) -> Option<Parts> {
        let up = self.up.as_ref()?;
        let reader = || {
            crewlet_history::Reader::new(
                "n1".into(),
                up.client.clone(),
                up.coord.roster("node"),
                up.store.clone(),
                0,
            )
        };
        let (_tx, pauses) = tokio::sync::watch::channel(None);
        Some(Parts {
            node_id: "n1".into(),
            client: up.client.clone(),
            survey: up.coord.survey(),
            positions: up.coord.records(Bucket::Positions),
            store: up.store.clone(),
            edge: up.edge.clone(),
            active: up.active.clone(),
            fleet: crewlet_fleet::View::new(
                "n1".into(),
                up.coord.survey(),
                up.client.clone(),
                reader(),
                up.active.clone(),
                pauses,
            ),
            history: reader(),
            seat_pauses: crewlet_seats::SeatPauses::new(
                "n1".into(),
                up.coord.pauses(),
                up.active.clone(),
            ),
        })
    }

    fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

struct World {
    _server: NatsServer,
    _data: tempfile::TempDir,
    faulty: Arc<Faulty>,
    operator: Operator,
}

async fn world(company: Option<Company>) -> World {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let mut opts = CoordOptions::new(Owner::incarnation("n1"));
    opts.lease_ttl = Duration::from_secs(30);
    let (faulty, coord) = Coord::breakable_memory(opts);
    let data = tempfile::tempdir().unwrap();
    let store = Arc::new(crewlet_store::Store::open_in(data.path()).unwrap());
    let active = ActiveCompany::new(company.map(Active::local));
    let edge = Arc::new(Edge::new(crewlet_ingress::EdgeConfig {
        node_id: "n1".into(),
        client: client.clone(),
        deliveries: coord.deliveries(),
        publisher: crewlet_observe::Publisher::new(
            "n1",
            store.clone(),
            async_nats::jetstream::new(client.clone()),
        ),
        active: active.clone(),
        plugins: Arc::default(),
        secrets: crewlet_secrets::Resolver::fixed::<String, String>([]),
        refused_log: None,
    }));
    let desk = Desk {
        up: Some(Up {
            client,
            coord,
            store,
            edge,
            active,
        }),
        draining: AtomicBool::new(false),
    };
    World {
        _server: server,
        _data: data,
        faulty,
        operator: Operator {
            engine: Arc::new(desk),
        },
    }
}

fn seat<'v>(listed: &'v Value, handle: &str) -> &'v Value {
    listed["seats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["seat"] == handle)
        .unwrap_or_else(|| panic!("no seat {handle} in {listed}"))
}

#[tokio::test]
async fn seats_are_listed_paused_and_resumed_and_an_unreadable_store_is_unknown() {
    let company = example_company();
    let w = world(Some(company.clone())).await;
    let listed = w.operator.seats().await.unwrap();
    assert_eq!(listed["org"], json!(company.org), "{listed}");
    assert_eq!(
        listed["seats"].as_array().unwrap().len(),
        company.seats.len(),
        "{listed}"
    );
    let ada = seat(&listed, "ada");
    assert_eq!(ada["holder"]["state"], "unowned", "{ada}");
    assert_eq!(ada["pause"]["paused"], false, "{ada}");
    assert_eq!(ada["turn"]["in_turn"], false, "{ada}");

    let paused = w
        .operator
        .pause(PauseSeat {
            seat: "ada".into(),
            reason: Some("audit".into()),
        })
        .await
        .unwrap();
    assert_eq!(paused["paused"], true, "{paused}");
    let listed = w.operator.seats().await.unwrap();
    let ada = seat(&listed, "ada");
    assert_eq!(ada["pause"]["paused"], true, "{ada}");
    assert_eq!(ada["pause"]["record"]["reason"], "audit", "{ada}");
    assert_eq!(seat(&listed, "grace")["pause"]["paused"], false);

    let resumed = w
        .operator
        .resume(SeatArg { seat: "ada".into() })
        .await
        .unwrap();
    assert_eq!(resumed["was_paused"], true, "{resumed}");
    let listed = w.operator.seats().await.unwrap();
    assert_eq!(seat(&listed, "ada")["pause"]["paused"], false);

    // The store cannot answer: unknown, never "unowned" or "not paused".
    w.faulty.break_store();
    let listed = w.operator.seats().await.unwrap();
    let ada = seat(&listed, "ada");
    assert_eq!(ada["holder"]["state"], "unknown", "{ada}");
    assert_eq!(ada["pause"]["paused"], "unknown", "{ada}");
    assert_eq!(ada["turn"]["in_turn"], "unknown", "{ada}");
    let refused = w
        .operator
        .pause(PauseSeat {
            seat: "ada".into(),
            reason: None,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(refused, OperatorError::Unavailable { .. }),
        "{refused}"
    );
}

#[tokio::test]
async fn bad_calls_are_refused_before_anything_is_sent() {
    let w = world(Some(example_company())).await;
    let unknown = w
        .operator
        .send(SendMessage {
            seat: "nobody".into(),
            text: "hi".into(),
            timeout_seconds: None,
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(
        unknown.contains("no seat `nobody`") && unknown.contains("ada"),
        "{unknown}"
    );
    let empty = w
        .operator
        .send(SendMessage {
            seat: "ada".into(),
            text: "  ".into(),
            timeout_seconds: None,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(empty, OperatorError::BadArgument { field: "text", .. }),
        "{empty}"
    );
    let wait = w
        .operator
        .send(SendMessage {
            seat: "ada".into(),
            text: "hi".into(),
            timeout_seconds: Some(601),
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(
        wait.contains("expected 1 to 600 seconds, found 601"),
        "{wait}"
    );
    let limit = w
        .operator
        .turns(SeatTurns {
            seat: "ada".into(),
            limit: Some(0),
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(
        limit.contains("expected 1 to 100 turns, found 0"),
        "{limit}"
    );
}

#[tokio::test]
async fn before_the_engine_and_without_a_company_the_tools_say_what_to_do() {
    let starting = Operator {
        engine: Arc::new(Desk {
            up: None,
            draining: AtomicBool::new(false),
        }),
    };
    let err = starting.seats().await.unwrap_err();
    assert!(matches!(err, OperatorError::Starting), "{err}");
    assert!(err.to_string().contains("retry in a few seconds"), "{err}");

    let w = world(None).await;
    let err = w.operator.seats().await.unwrap_err();
    assert!(matches!(err, OperatorError::NoCompany), "{err}");
    assert!(err.to_string().contains("PUT /config"), "{err}");
}
