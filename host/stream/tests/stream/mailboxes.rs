//! Mailbox records and retirement against a real nats-server: every change
//! to a record is a compare-and-set, a seat gone past the grace loses its
//! consumer, and a seat that returns gets it back and receives its wakes.

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer};
use crewlet_bus::{AGENT_STREAM, inbox_subject, mailbox_durable};
use crewlet_coord::{Answer, Bucket, Coord, CoordOptions, Owner};
use crewlet_stream::streams::ensure_streams;
use crewlet_stream::{
    MAILBOX_CLASS, MailboxRecord, RetireError, RetireReport, ensure_mailboxes, retire_mailbox,
    retire_mailboxes,
};
use crewlet_testkit::NatsServer;
use futures::StreamExt;

const GRACE: Duration = Duration::from_secs(600);
const T0: i64 = 1_800_000_000_000;

async fn setup(server: &NatsServer) -> (jetstream::Context, Coord) {
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = jetstream::new(client.clone());
    ensure_streams(&js, 1).await.unwrap();
    let coord = Coord::open(client, CoordOptions::new(Owner::incarnation("mbx")))
        .await
        .unwrap();
    (js, coord)
}

async fn record(coord: &Coord, handle: &str) -> (MailboxRecord, u64) {
    match coord
        .get_record(Bucket::Mailboxes, MAILBOX_CLASS, handle)
        .await
        .unwrap()
    {
        Answer::Yes((v, rev)) => (serde_json::from_value(v).unwrap(), rev),
        Answer::No(()) => panic!("no mailbox record for {handle}"),
    }
}

fn set(handles: &[&str]) -> BTreeSet<String> {
    handles.iter().map(|h| (*h).to_owned()).collect()
}

async fn consumer_exists(js: &jetstream::Context, handle: &str) -> bool {
    let stream = js.get_stream(AGENT_STREAM).await.unwrap();
    match stream.consumer_info(mailbox_durable(handle)).await {
        Ok(_) => true,
        Err(e) if e.kind() == jetstream::context::ConsumerInfoErrorKind::NotFound => false,
        Err(e) => panic!("consumer info for {handle}: {e}"),
    }
}

#[tokio::test]
async fn a_seat_gone_past_the_grace_is_retired_and_a_returning_seat_gets_its_mailbox_back() {
    let server = NatsServer::start();
    let (js, coord) = setup(&server).await;
    let mailboxes = coord.records(Bucket::Mailboxes);

    assert_eq!(
        ensure_mailboxes(&js, &mailboxes, ["ada", "bob"])
            .await
            .unwrap(),
        2
    );
    let (ada, r1) = record(&coord, "ada").await;
    assert_eq!(ada, MailboxRecord::active("ada"));
    assert!(consumer_exists(&js, "ada").await);
    ensure_mailboxes(&js, &mailboxes, ["ada", "bob"])
        .await
        .unwrap();
    assert_eq!(
        record(&coord, "ada").await.1,
        r1,
        "an active record was written again"
    );

    // Ada leaves the company: stamped, consumer kept through the grace.
    let report = retire_mailboxes(&js, &mailboxes, &set(&["bob"]), T0, GRACE)
        .await
        .unwrap();
    assert_eq!(
        report,
        RetireReport {
            stamped: vec!["ada".into()],
            ..RetireReport::default()
        }
    );
    let (stamped, r2) = record(&coord, "ada").await;
    assert_eq!(stamped.absent_since_ms, Some(T0));
    assert_eq!(stamped.retired_at_ms, None);
    assert!(r2 > r1);
    assert_eq!(record(&coord, "bob").await.0, MailboxRecord::active("bob"));
    let within = T0 + GRACE.as_millis() as i64;
    let report = retire_mailboxes(&js, &mailboxes, &set(&["bob"]), within, GRACE)
        .await
        .unwrap();
    assert_eq!(report, RetireReport::default(), "retired within the grace");
    assert_eq!(record(&coord, "ada").await.1, r2);
    assert!(consumer_exists(&js, "ada").await);

    // A stamped seat that is in the company again (the stamp came from a
    // holder a revision behind) is made active again; its consumer stays.
    let past = within + 1;
    let report = retire_mailboxes(&js, &mailboxes, &set(&["ada", "bob"]), past, GRACE)
        .await
        .unwrap();
    assert_eq!(
        report,
        RetireReport {
            restored: vec!["ada".into()],
            ..RetireReport::default()
        }
    );
    assert_eq!(record(&coord, "ada").await.0, MailboxRecord::active("ada"));
    assert!(consumer_exists(&js, "ada").await);
    // Gone again: stamped at T0 once more.
    let report = retire_mailboxes(&js, &mailboxes, &set(&["bob"]), T0, GRACE)
        .await
        .unwrap();
    assert_eq!(report.stamped, ["ada"]);

    // Past the grace: consumer deleted, record retired.
    let report = retire_mailboxes(&js, &mailboxes, &set(&["bob"]), past, GRACE)
        .await
        .unwrap();
    assert_eq!(
        report,
        RetireReport {
            retired: vec!["ada".into()],
            ..RetireReport::default()
        }
    );
    assert!(!consumer_exists(&js, "ada").await);
    assert!(consumer_exists(&js, "bob").await);
    let (retired, r3) = record(&coord, "ada").await;
    assert_eq!(
        (retired.absent_since_ms, retired.retired_at_ms),
        (Some(T0), Some(past))
    );
    assert!(r3 > r2);
    let report = retire_mailboxes(&js, &mailboxes, &set(&["bob"]), past + 1, GRACE)
        .await
        .unwrap();
    assert_eq!(report, RetireReport::default(), "retired twice");
    assert_eq!(record(&coord, "ada").await.1, r3);

    // Ada returns: active again, and her wakes reach her mailbox.
    ensure_mailboxes(&js, &mailboxes, ["ada", "bob"])
        .await
        .unwrap();
    let (back, r4) = record(&coord, "ada").await;
    assert_eq!(back, MailboxRecord::active("ada"));
    assert!(r4 > r3);
    js.publish(inbox_subject("ada"), "wake".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let consumer: PullConsumer = js
        .get_stream(AGENT_STREAM)
        .await
        .unwrap()
        .get_consumer(&mailbox_durable("ada"))
        .await
        .unwrap();
    let mut batch = consumer
        .fetch()
        .max_messages(1)
        .expires(Duration::from_secs(5))
        .messages()
        .await
        .unwrap();
    let msg = batch.next().await.expect("a wake").unwrap();
    assert_eq!(&msg.payload[..], b"wake");
    msg.ack().await.unwrap();
}

/// A record written by a newer build (a key this one does not know) is
/// the same mailbox: ensure leaves it unwritten. One that names another
/// durable is put right by compare-and-set.
#[tokio::test]
async fn ensure_writes_only_a_record_that_differs() {
    let server = NatsServer::start();
    let (js, coord) = setup(&server).await;
    let mailboxes = coord.records(Bucket::Mailboxes);
    let mut newer = serde_json::to_value(MailboxRecord::active("cy")).unwrap();
    newer["future_key"] = serde_json::json!({"x": 1});
    let r1 = coord
        .create_record(Bucket::Mailboxes, MAILBOX_CLASS, "cy", &newer)
        .await
        .unwrap()
        .yes()
        .unwrap();
    let mut other = MailboxRecord::active("dee");
    other.durable = "inbox-someone-else".into();
    let o1 = coord
        .create_record(
            Bucket::Mailboxes,
            MAILBOX_CLASS,
            "dee",
            &serde_json::to_value(&other).unwrap(),
        )
        .await
        .unwrap()
        .yes()
        .unwrap();
    ensure_mailboxes(&js, &mailboxes, ["cy", "dee"])
        .await
        .unwrap();
    assert_eq!(record(&coord, "cy").await.1, r1);
    let (dee, o2) = record(&coord, "dee").await;
    assert_eq!(dee, MailboxRecord::active("dee"));
    assert!(o2 > o1);
    assert!(consumer_exists(&js, "cy").await && consumer_exists(&js, "dee").await);
}

/// A record that does not decode is reported and left alone; the others
/// are still handled in the same pass.
#[tokio::test]
async fn one_bad_record_does_not_stop_the_pass() {
    let server = NatsServer::start();
    let (js, coord) = setup(&server).await;
    let mailboxes = coord.records(Bucket::Mailboxes);
    ensure_mailboxes(&js, &mailboxes, ["eve"]).await.unwrap();
    let bad = coord
        .create_record(
            Bucket::Mailboxes,
            MAILBOX_CLASS,
            "fay",
            &serde_json::json!({"durable": 7}),
        )
        .await
        .unwrap()
        .yes()
        .unwrap();
    let report = retire_mailboxes(&js, &mailboxes, &BTreeSet::new(), T0, GRACE)
        .await
        .unwrap();
    assert_eq!(report.stamped, vec!["eve".to_owned()]);
    assert_eq!(report.failed.len(), 1, "{report:?}");
    assert_eq!(report.failed[0].0, "fay");
    assert!(report.failed[0].1.contains("does not decode"), "{report:?}");
    assert_eq!(
        coord
            .get_record(Bucket::Mailboxes, MAILBOX_CLASS, "fay")
            .await
            .unwrap()
            .yes()
            .unwrap()
            .1,
        bad
    );
}

/// The race a retirement can lose: the seat comes back (ensure clears the
/// stamp and finds its consumer) after the retirer read the record. The
/// retirer's delete takes the consumer, its compare-and-set loses, and it
/// creates the consumer again instead of leaving an active seat deaf.
#[tokio::test]
async fn a_seat_that_returns_mid_retirement_keeps_its_consumer() {
    let server = NatsServer::start();
    let (js, coord) = setup(&server).await;
    let mailboxes = coord.records(Bucket::Mailboxes);
    ensure_mailboxes(&js, &mailboxes, ["gus"]).await.unwrap();
    retire_mailboxes(&js, &mailboxes, &BTreeSet::new(), T0, GRACE)
        .await
        .unwrap();
    let (stamped, read_at) = record(&coord, "gus").await;
    assert_eq!(stamped.absent_since_ms, Some(T0));

    ensure_mailboxes(&js, &mailboxes, ["gus"]).await.unwrap();
    let (back, back_at) = record(&coord, "gus").await;
    assert!(back.is_active() && back_at > read_at);

    let past = T0 + GRACE.as_millis() as i64 + 1;
    let answer = retire_mailbox(&js, &mailboxes, "gus", &stamped, read_at, past).await;
    assert_eq!(answer, Err(RetireError::CameBack { revision: read_at }));
    assert!(
        consumer_exists(&js, "gus").await,
        "the returned seat is deaf"
    );
    assert_eq!(record(&coord, "gus").await, (back, back_at));
}
