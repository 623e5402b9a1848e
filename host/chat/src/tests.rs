use std::time::Duration;

use crewlet_company::{Active, Company};
use crewlet_coord::bucket::Retentions;
use crewlet_coord::{Faulty, Kv, MemoryKv, SystemClock};

use super::*;

const EXAMPLE: &str = include_str!("../../../examples/company.toml");

fn kv() -> (Arc<Faulty>, Arc<dyn Kv>) {
    let ret = Retentions {
        lease_ttl: Duration::from_secs(45),
        status: Duration::from_secs(60),
        rate: Duration::from_secs(60),
    };
    let faulty = Faulty::new(Arc::new(MemoryKv::new(Arc::new(SystemClock), &ret)));
    (faulty.clone(), faulty)
}

/// A node of one fleet: its own mirror of the shared bucket, one keyring.
async fn secrets(kv: &Arc<dyn Kv>, ring: &tempfile::TempDir) -> Arc<Secrets> {
    let keyring = crewlet_secrets::Keyring::open_or_create(&ring.path().join("keyring")).unwrap();
    Arc::new(Secrets::start(kv.clone(), keyring).await)
}

/// The node as the chat reaches it; `up: false` is an engine still starting.
struct Node {
    secrets: Arc<Secrets>,
    active: ActiveCompany,
    up: bool,
}

impl ChatNode for Node {
    fn engine(&self) -> Option<Engine<'_>> {
        self.up.then_some(Engine {
            secrets: &self.secrets,
            active: &self.active,
            module: None,
        })
    }
    fn edge(&self) -> Option<&Arc<Edge>> {
        None
    }
}

/// The operator tokens' judge: every token is someone else's business.
struct NoOperators;

impl Authority for NoOperators {
    fn check(&self, _token: &str) -> Verdict {
        Verdict::Refused(Refused::Unknown)
    }
}

#[tokio::test]
async fn two_nodes_starting_together_make_one_chat_secret_and_agree_on_it() {
    let (_f, kv) = kv();
    let ring = tempfile::tempdir().unwrap();
    let (a, b) = (secrets(&kv, &ring).await, secrets(&kv, &ring).await);
    let (_stop_tx, stop) = watch::channel(false);
    tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(
            ensure_secret(a.clone(), stop.clone()),
            ensure_secret(b.clone(), stop),
        )
    })
    .await
    .expect("both nodes settle the secret");
    let made = a.record(SECRET).await.unwrap().expect("the secret is made");
    let seen = b
        .record(SECRET)
        .await
        .unwrap()
        .expect("the other node reads it");
    assert_eq!(made.0.updated_ms, seen.0.updated_ms, "one secret, not two");
    let value = a.resolver().lookup(SECRET).found().unwrap();
    assert_eq!(value.len(), 64, "32 random bytes in hex: {value}");
    assert!(value.bytes().all(|c| c.is_ascii_hexdigit()));
}

#[tokio::test]
async fn making_the_secret_stops_when_asked_while_the_bucket_cannot_answer() {
    let (faulty, kv) = kv();
    let ring = tempfile::tempdir().unwrap();
    let secrets = secrets(&kv, &ring).await;
    faulty.break_store();
    let (stop_tx, stop) = watch::channel(false);
    let making = tokio::spawn(ensure_secret(secrets.clone(), stop));
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), making)
        .await
        .expect("the loop ends on stop")
        .unwrap();
    faulty.heal();
    assert!(
        secrets.record(SECRET).await.unwrap().is_none(),
        "nothing made"
    );
}

#[tokio::test]
async fn a_seat_credential_is_that_seat_and_anything_else_is_refused_or_unknown() {
    let (_f, kv) = kv();
    let ring = tempfile::tempdir().unwrap();
    let secrets = secrets(&kv, &ring).await;
    let (_stop_tx, stop) = watch::channel(false);
    ensure_secret(secrets.clone(), stop).await;
    let secret = secrets.resolver().lookup(SECRET).found().unwrap();
    let company = Company::parse(EXAMPLE).unwrap();
    let seat = company.seats.keys().next().unwrap().to_string();
    let node = Arc::new(Node {
        secrets: secrets.clone(),
        active: ActiveCompany::new(Some(Active::local(company))),
        up: true,
    });
    let callers = Callers {
        operators: Arc::new(NoOperators),
        node: node.clone(),
    };
    let good = seat_credential(&secret, &seat);
    assert_eq!(
        seat_token(&secrets.resolver(), &seat).found().as_deref(),
        Some(good.as_str()),
        "the template's token is the credential the guard accepts"
    );
    assert_eq!(
        callers.check(&good),
        Verdict::Seat {
            handle: seat.clone()
        }
    );
    let refused = Verdict::Refused(Refused::Unknown);
    let mut forged = good.clone();
    forged.pop();
    forged.push(if good.ends_with('0') { '1' } else { '0' });
    assert_eq!(callers.check(&forged), refused, "another MAC");
    assert_eq!(
        callers.check(&seat_credential("another secret", &seat)),
        refused
    );
    assert_eq!(
        callers.check(&seat_credential(&secret, "nobody-here")),
        refused,
        "a handle the company does not seat"
    );
    assert_eq!(callers.check("crewlet-chat.no-dot"), refused);
    assert_eq!(
        callers.check("an-operator-token"),
        refused,
        "the operators' judge"
    );
    let starting = Callers {
        operators: Arc::new(NoOperators),
        node: Arc::new(Node {
            secrets,
            active: ActiveCompany::new(None),
            up: false,
        }),
    };
    assert!(
        matches!(starting.check(&good), Verdict::Unknown(_)),
        "an engine not up cannot say"
    );
}

#[test]
fn the_chat_url_is_the_api_as_a_child_on_this_machine_reaches_it() {
    let mut config = crewlet_config::NodeConfig::from_toml(
        "test",
        "",
        std::path::Path::new("/tmp"),
        &Default::default(),
        &|_| None,
    )
    .unwrap();
    config.api.host = "0.0.0.0".parse().unwrap();
    config.api.port = 7411;
    assert_eq!(api_url(&config), "http://127.0.0.1:7411");
    config.api.host = "::1".parse().unwrap();
    assert_eq!(api_url(&config), "http://[::1]:7411");
}

#[test]
fn a_read_is_rendered_one_line_a_message_and_says_when_there_is_none() {
    let answer = json!({ "messages": [
        { "id": "m1", "author": "ada", "text": "hello", "replies": 2 },
        { "id": "m2", "author": "operator", "text": "hi" },
    ]});
    assert_eq!(
        render(&answer),
        "m1  ada: hello  (2 replies)\nm2  operator: hi\n"
    );
    assert_eq!(render(&json!({ "messages": [] })), "(no messages)\n");
}

#[test]
fn a_module_refusal_is_answered_by_its_first_word() {
    let kind = |why: &str| match refused(why.to_owned()) {
        ChatRefusal::NotFound(_) => "not found",
        ChatRefusal::Unavailable(_) => "unavailable",
        ChatRefusal::Bad(_) => "bad",
        other => panic!("{other:?}"),
    };
    assert_eq!(kind("not-found: no channel #x"), "not found");
    assert_eq!(kind("unavailable: the bucket"), "unavailable");
    assert_eq!(kind("bucket-full: the channel is full"), "unavailable");
    assert_eq!(kind("text too long"), "bad");
}
