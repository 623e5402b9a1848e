//! The usage domain end to end at the crate's level: two publishers of one
//! node's day — before and after a restart — never add up (the newer whole
//! value replaces), and the read sums by period and key.

use crate::common;

use common::{Node, js, until};
use crewlet_statelog::usage::{
    USAGE_DAYS, UsageEvent, UsageObject, UsagePublisher, UsageQuery, tally,
};
use crewlet_testkit::NatsServer;
use serde_json::json;

fn call(at_ms: i64, seat: &str, input: u64) -> UsageEvent {
    UsageEvent {
        kind: "model_call".into(),
        at_ms,
        seat: Some(seat.into()),
        payload: json!({"phase": "executor", "model": "m1", "input_tokens": input, "output_tokens": 1}),
    }
}

#[tokio::test]
async fn a_day_published_again_after_a_restart_replaces_and_never_adds() {
    let server = NatsServer::start();
    let (_c, js) = js(&server.url()).await;
    let node = Node::new();
    let applier = node.applier(&js, "n0", None, None);
    let utc = jiff::tz::TimeZone::UTC;
    let day = 1_796_550_000_000; // 2026-12-06, UTC
    let role = |_: &str| "eng".to_owned();
    let mut before = UsagePublisher::new(js.clone());
    let sent = before
        .publish(tally(
            [call(day, "ada", 10), call(day + 1, "ada", 5)],
            &utc,
            "n1",
            role,
        ))
        .await
        .unwrap();
    assert_eq!(sent, 1);
    // The node restarts: a fresh publisher tallies the same day from the
    // node's log, now with one more call, and publishes it whole.
    let mut after = UsagePublisher::new(js.clone());
    let events = [
        call(day, "ada", 10),
        call(day + 1, "ada", 5),
        call(day + 2, "ada", 7),
    ];
    after
        .publish(tally(events.clone(), &utc, "n1", role))
        .await
        .unwrap();
    // Unchanged values are not sent again by the same publisher.
    assert_eq!(
        after
            .publish(tally(events, &utc, "n1", role))
            .await
            .unwrap(),
        0
    );
    applier
        .barrier(std::time::Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        node.input_tokens("n1", "ada"),
        Some(22),
        "the restart's value was added, not replaced"
    );
    let rows = UsageQuery::parse(Some("month"), Some("role"), None, None)
        .unwrap()
        .run(&node.estate.reader().unwrap())
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (
            rows[0].period.as_str(),
            rows[0].key.as_deref(),
            rows[0].calls
        ),
        ("2026-12", Some("eng"), 3)
    );
    let s = until(&applier, "applied", |s| s.position >= 2).await;
    assert_eq!(s.ops_lost, 0);
    applier.stop().await;
}

#[tokio::test]
async fn the_applier_ages_out_days_past_the_horizon() {
    let server = NatsServer::start();
    let (_c, js) = js(&server.url()).await;
    let node = Node::new();
    let applier = node.applier(&js, "n0", None, None);
    let now = crewlet_os::now_ms();
    let day = |days_ago: i64| {
        let at = now - days_ago * 24 * 3600 * 1000;
        crewlet_statelog::usage::company_day(at, &jiff::tz::TimeZone::UTC)
    };
    let mut publisher = UsagePublisher::new(js.clone());
    for (seat, ago) in [
        ("old", USAGE_DAYS + 2),
        ("kept", USAGE_DAYS - 2),
        ("today", 0),
    ] {
        let mut objects = tally([call(now, seat, 1)], &jiff::tz::TimeZone::UTC, "n1", |_| {
            String::new()
        });
        if let UsageObject::Tokens(t) = &mut objects[0] {
            t.day = day(ago).into();
        }
        publisher.publish(objects).await.unwrap();
    }
    applier
        .barrier(std::time::Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        node.input_tokens("n1", "old"),
        None,
        "a day past 181 was kept"
    );
    assert_eq!(node.input_tokens("n1", "kept"), Some(1));
    assert_eq!(node.input_tokens("n1", "today"), Some(1));
    applier.stop().await;
}

#[test]
fn a_query_with_a_wrong_word_names_it() {
    let e = UsageQuery::parse(Some("year"), None, None, None).unwrap_err();
    assert!(e.to_string().contains("year"), "{e}");
    let e = UsageQuery::parse(None, Some("color"), None, None).unwrap_err();
    assert!(e.to_string().contains("color"), "{e}");
    let e = UsageQuery::parse(None, None, Some("12/06/2026"), None).unwrap_err();
    assert!(e.to_string().contains("from"), "{e}");
}

#[tokio::test]
async fn tokens_read_by_provider_slot_and_a_record_that_named_none_reads_unknown() {
    let server = NatsServer::start();
    let (_c, js) = js(&server.url()).await;
    let node = Node::new();
    let applier = node.applier(&js, "n0", None, None);
    let day = 1_796_550_000_000; // 2026-12-06, UTC
    let served = |slot: &str, input: u64| UsageEvent {
        payload: json!({"phase": "executor", "model": "openai/m1", "slot": slot,
            "input_tokens": input, "output_tokens": 1}),
        ..call(day, "ada", input)
    };
    let mut objects = tally(
        [
            served("openai/m1#aaaaaaaaaaaa", 10),
            served("openai/m1#bbbbbbbbbbbb", 4),
            served("openai/m1#aaaaaaaaaaaa", 1),
        ],
        &jiff::tz::TimeZone::UTC,
        "n1",
        |_| "eng".into(),
    );
    // An older build's node: its calls' events carry no slot, and its
    // record no `slot` field.
    let older = tally(
        [call(day, "bob", 7)],
        &jiff::tz::TimeZone::UTC,
        "n2",
        |_| "eng".into(),
    );
    let record = older[0].record();
    assert!(
        record.body.get("slot").is_none(),
        "an unsaid slot is left out of the record: {}",
        record.body
    );
    objects.extend(older);
    UsagePublisher::new(js.clone())
        .publish(objects)
        .await
        .unwrap();
    applier
        .barrier(std::time::Duration::from_secs(10))
        .await
        .unwrap();
    let rows = UsageQuery::parse(None, Some("provider"), None, None)
        .unwrap()
        .run(&node.estate.reader().unwrap())
        .unwrap();
    let by: Vec<_> = rows
        .iter()
        .map(|r| (r.key.as_deref(), r.calls, r.input_tokens))
        .collect();
    assert_eq!(
        by,
        [
            (None, 1, 7),
            (Some("openai/m1#aaaaaaaaaaaa"), 2, 11),
            (Some("openai/m1#bbbbbbbbbbbb"), 1, 4),
        ]
    );
    assert!(
        rows.iter().all(|r| r.turns.is_none() && r.fires.is_none()),
        "turns and fires have no slot: {rows:?}"
    );
    let json = serde_json::to_value(&rows[0]).unwrap();
    assert_eq!(json["key"], serde_json::Value::Null, "unknown, not a slot");
    applier.stop().await;
}
