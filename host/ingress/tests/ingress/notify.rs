//! The notification service against a real nats-server: what counts
//! towards dead-lettering, and what a redelivery charges.
//!
//! Faults are real: a valve made unknown by failing the coordination
//! store's writes to its key ([`crewlet_coord::Faulty`]), a valve closed by
//! spending it with [`crewlet_coord::Coord::admit`], a wake publish that
//! fails because no stream takes the seat's inbox subject yet.

use crate::common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{World, inbound, until};
use crewlet_coord::Answer;
use crewlet_ingress::notify::{MAX_DELIVER, VALVE_LIMIT, VALVE_WINDOW};

/// Five delays (the valve unknown), then one real failure (the wake has no
/// stream to land in), then success: one wake, nothing dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delays_then_one_real_failure_do_not_dead_letter() {
    let w = World::start().await;
    w.faulty
        .fail_writes_to(Some(&crewlet_coord::names::encode_token("wake:ada")));
    let service = w.notify().await;
    w.publish_inbound(&inbound("d-1", &["@ada"])).await;

    // A delivery is redelivered only after its previous delivery was
    // answered, so a sixth delivery means five delays were answered.
    until(Duration::from_secs(40), "six deliveries", || async {
        w.notify_consumer().await.delivered.consumer_sequence >= 6
    })
    .await;
    assert!(w.dead_letters().await.is_empty());

    // The valve answers again; the wake publish fails for real.
    w.faulty.heal();
    until(
        Duration::from_secs(20),
        "the real failure handled (passed on or dead-lettered)",
        || async { w.inbound_last_seq().await >= 2 || !w.dead_letters().await.is_empty() },
    )
    .await;
    assert_eq!(
        w.dead_letters().await,
        Vec::<serde_json::Value>::new(),
        "a delay counted towards dead-lettering"
    );

    w.open_mailboxes().await;
    until(Duration::from_secs(20), "ada's wake", || async {
        w.pending_wakes("ada").await >= 1
    })
    .await;
    w.until_settled().await;
    assert_eq!(w.take_wakes("ada").await.len(), 1);
    assert!(w.dead_letters().await.is_empty());
    service.stop().await;
}

/// [`MAX_DELIVER`] real failures dead-letter, with the reason, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_deliver_real_failures_dead_letter_with_the_reason() {
    let w = World::start().await;
    let service = w.notify().await;
    let sent = inbound("d-2", &["@ada"]);
    w.publish_inbound(&sent).await;
    until(Duration::from_secs(40), "a dead letter", || async {
        !w.dead_letters().await.is_empty()
    })
    .await;
    w.until_settled().await;
    let letters = w.dead_letters().await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert!(
        letter["reason"]
            .as_str()
            .is_some_and(|r| r.contains("wake for ada not published")),
        "{letter}"
    );
    assert_eq!(letter["failures"], MAX_DELIVER, "{letter}");
    assert_eq!(letter["trace_id"], sent.trace_id.as_str());
    let original: crewlet_bus::Inbound =
        serde_json::from_str(letter["original"].as_str().unwrap()).unwrap();
    assert_eq!(original, sent);
    // The event is recorded after the delivery is acknowledged, so
    // "settled" does not mean "recorded" yet.
    until(Duration::from_secs(10), "the dead-letter event", || async {
        !w.events("delivery_dead_lettered").is_empty()
    })
    .await;
    let dead = w.events("delivery_dead_lettered");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].trace_id.as_deref(), Some(sent.trace_id.as_str()));
    service.stop().await;
}

/// A two-seat delivery whose second seat's valve is closed: the first seat
/// is charged and woken once however often the second is retried, and the
/// second is woken once its valve opens (its window rolls over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_seat_is_not_charged_again_while_another_waits_for_its_valve() {
    let w = World::start().await;
    w.open_mailboxes().await;
    let service = w.notify().await;

    // The valve's window is a wall-clock slot: start early in one, so the
    // closed valve holds for several retries before the slot rolls over.
    let window_ms = VALVE_WINDOW.as_millis() as u64;
    let left = || {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        window_ms - (now.as_millis() as u64 % window_ms)
    };
    if left() < 12_000 {
        // Waiting for a clock boundary, not for another task.
        tokio::time::sleep(Duration::from_millis(left() + 50)).await;
    }
    let mut spent = 0;
    loop {
        match w.coord.admit("wake:linus", VALVE_LIMIT, VALVE_WINDOW).await {
            Ok(Answer::Yes(_)) => spent += 1,
            Ok(Answer::No(_)) => break,
            Err(e) => panic!("the valve did not answer: {e}"),
        }
    }
    assert_eq!(spent, VALVE_LIMIT);
    let closed_for = Duration::from_millis(left());

    w.publish_inbound(&inbound("d-3", &["@ada", "@linus"]))
        .await;
    until(Duration::from_secs(10), "ada's wake", || async {
        w.pending_wakes("ada").await >= 1
    })
    .await;
    until(
        closed_for + Duration::from_secs(15),
        "linus's wake once his valve opens",
        || async { w.pending_wakes("linus").await >= 1 },
    )
    .await;
    w.until_settled().await;

    let retried = w.notify_consumer().await.delivered.consumer_sequence;
    assert!(
        retried >= 3,
        "linus's wake was retried {retried} times: too few to tell"
    );
    assert_eq!(w.valve_charges("wake:ada").await, 1, "ada's valve charged");
    assert_eq!(w.take_wakes("ada").await.len(), 1);
    assert_eq!(w.take_wakes("linus").await.len(), 1);
    let published: Vec<_> = w
        .events("wake_published")
        .into_iter()
        .map(|e| e.payload["handle"].as_str().unwrap_or("?").to_owned())
        .collect();
    assert_eq!(
        published.iter().filter(|h| *h == "ada").count(),
        1,
        "{published:?}"
    );
    assert_eq!(
        published.iter().filter(|h| *h == "linus").count(),
        1,
        "{published:?}"
    );
    assert!(w.dead_letters().await.is_empty());
    service.stop().await;
}

/// An unmentioned message in a thread wakes the seats following it; while
/// who follows it is unknown (the store unreachable) the delivery waits —
/// redelivered, never taken as addressed to nobody — and a follower that
/// left the company is skipped, not an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_follow_read_waits_and_is_never_nobody() {
    use crewlet_coord::ChatThread;

    let w = World::start().await;
    w.open_mailboxes().await;
    let mut sent = inbound("f-1", &[]);
    sent.thread = Some("42".into());
    let channel = sent.channel.clone().unwrap();
    let thread = ChatThread::new("github", &channel, "42");
    let follows = w.coord.follows();
    for seat in ["ada", "gone"] {
        follows.follow(&thread, seat).await.unwrap();
    }
    let service = w.notify().await;

    w.faulty.break_store();
    w.publish_inbound(&sent).await;
    // A redelivery means the first delivery was answered, and not acked.
    until(Duration::from_secs(20), "a redelivery", || async {
        w.notify_consumer().await.delivered.consumer_sequence >= 2
    })
    .await;
    assert!(
        w.events("delivery_unrouted").is_empty(),
        "an unknown follow read was taken as nobody"
    );
    assert_eq!(w.pending_wakes("ada").await, 0);

    w.faulty.heal();
    until(Duration::from_secs(20), "ada's wake by follow", || async {
        w.pending_wakes("ada").await >= 1
    })
    .await;
    w.until_settled().await;
    let wakes = w.take_wakes("ada").await;
    assert_eq!(wakes.len(), 1, "{wakes:?}");
    assert_eq!(wakes[0].reason, "follow");
    assert_eq!(wakes[0].thread.as_deref(), Some("42"));
    assert!(
        w.dead_letters().await.is_empty(),
        "the gone seat is an error"
    );
    assert!(w.events("delivery_unrouted").is_empty());
    service.stop().await;
}
