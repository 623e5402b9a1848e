//! Every round charged, in the windows current when it is charged; unknown
//! is an outage, never "out of budget".

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crewlet_coord::{Answer, BudgetView, Caps, Scope};
use crewlet_turns::{Outcome, TurnEnd, estimate, trigger, windows_at};
use serde_json::Value;

use crate::harness::{
    Doc, Fixture, NEW_YEAR, Step, assignment, list_tools, mention, outcome, post, review, submit,
};

fn seat() -> Scope {
    Scope::Seat("ada".into())
}

fn day_cap(cap: u64) -> Doc {
    Doc {
        seat_day_cap: Some(cap),
        ..Doc::default()
    }
}

async fn seat_budget(f: &Fixture) -> BudgetView {
    let now = crewlet_coord::Clock::now(&f.clock);
    let windows = windows_at(&f.active.company, now);
    f.coord
        .budget(&seat(), &windows)
        .await
        .expect("budget read")
}

#[tokio::test]
async fn each_round_is_charged_in_the_windows_current_when_it_is_charged() {
    // Sunday 2026-01-04 23:50 in Berlin (22:50 UTC); the second call is
    // answered at Monday 00:10 there — still Sunday in UTC.
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(NEW_YEAR + 3 * 86_400 + 82_200);
    let f = Fixture::at(
        Doc {
            timezone: "Europe/Berlin",
            ..Doc::default()
        },
        start,
    );
    let sunday: Arc<Mutex<Option<BudgetView>>> = Arc::default();
    let (coord, clock, seen, company) = (
        f.coord.clone(),
        f.clock.clone(),
        sunday.clone(),
        f.active.company.clone(),
    );
    f.script([
        Step::calls(vec![list_tools()]).cost(10, 2),
        Step::calls(vec![submit("no_action", "nothing to do")])
            .cost(20, 3)
            .before(move || async move {
                let windows = windows_at(&company, crewlet_coord::Clock::now(&clock));
                *seen.lock().unwrap() = Some(coord.budget(&seat(), &windows).await.unwrap());
                clock.advance(Duration::from_secs(20 * 60));
            }),
        Step::calls(vec![review("done", "")]).cost(30, 4),
    ]);
    let end = f.run(&[assignment("d1")]).await;
    assert_eq!(outcome(&end), &Outcome::NoAction);

    let before = sunday.lock().unwrap().clone().expect("read on Sunday");
    assert_eq!(
        (before.day.label.as_str(), before.day.spent),
        ("2026-01-04", 12)
    );
    assert_eq!(before.week.label, "2026-W01");
    let after = seat_budget(&f).await;
    assert_eq!(
        (after.day.label.as_str(), after.day.spent),
        ("2026-01-05", 23 + 34),
        "Monday's rounds in Monday's window"
    );
    assert_eq!(
        (after.week.label.as_str(), after.week.spent),
        ("2026-W02", 57)
    );
    assert_eq!(
        (after.month.label.as_str(), after.month.spent),
        ("2026-01", 12 + 57)
    );
    let windows = windows_at(&f.active.company, crewlet_coord::Clock::now(&f.clock));
    let company = f.coord.budget(&Scope::Company, &windows).await.unwrap();
    assert_eq!((company.day.spent, company.month.spent), (57, 69));
}

#[tokio::test]
async fn a_refused_charge_runs_the_paid_answers_tools_then_parks_before_the_next_call() {
    let f = Fixture::new(day_cap(5_000));
    f.script([
        Step::calls(vec![list_tools()]),
        // The answer that passes the cap asked for a reply: it is paid for,
        // so the reply is posted; only the next call is refused.
        Step::calls(vec![post("C1", "17.1", "on it")]).cost(4_000, 2_000),
        Step::calls(vec![submit("delivered", "x")]),
    ]);
    let end = f.run(&[mention("d1")]).await;
    let TurnEnd::Parked { park, .. } = &end else {
        panic!("not parked: {end:?}");
    };
    assert_eq!(
        (park.scope.clone(), park.period, park.need),
        (seat(), crewlet_coord::Period::Day, 1)
    );
    assert_eq!(
        f.brain.asked().len(),
        2,
        "the refusal stopped the third call"
    );
    assert_eq!(
        f.chat.posts().len(),
        1,
        "the paid answer's reply was posted"
    );
    let refused = f.of_kind("budget_exhausted").await;
    assert_eq!(refused.len(), 1);
    assert_eq!(
        refused[0],
        serde_json::json!({
            "turn_id": refused[0]["turn_id"], "scope": "seat:ada", "period": "day",
            "spent": 6_012, "cap": 5_000, "before_first_call": false,
        }),
        "the refusal carries the spend it saw, the refused round included"
    );
    let parked = f.of_kind("budget_parked").await;
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0]["scope"], "seat:ada");
    assert_eq!(parked[0]["until"], "2026-01-02T00:00:00+00:00");
    let ended = f.of_kind("turn_ended").await;
    assert_eq!(ended[0]["outcome"], "budget_exhausted");
    assert_eq!(
        seat_budget(&f).await.day.spent,
        6_012,
        "a refused round still counts"
    );
    let key = trigger::trigger_key(&mention("d1"));
    assert!(
        matches!(f.coord.completed(&key).await, Ok(Answer::No(()))),
        "parked work is not completed"
    );
}

#[tokio::test]
async fn a_full_window_parks_the_work_before_the_first_call() {
    let f = Fixture::new(day_cap(20));
    let windows = windows_at(&f.active.company, crewlet_coord::Clock::now(&f.clock));
    let caps = Caps {
        day: Some(20),
        ..Caps::default()
    };
    let full = f
        .coord
        .charge("ada", &windows, &Caps::default(), &caps, 20)
        .await;
    assert!(matches!(full, Ok(Answer::Yes(_))));
    f.script([Step::calls(vec![submit("no_action", "x")])]);
    let end = f.run(&[assignment("d1")]).await;
    let TurnEnd::Parked { park, .. } = &end else {
        panic!("not parked: {end:?}");
    };
    assert_eq!((park.spent, park.cap), (20, 20));
    assert!(f.brain.asked().is_empty());
    assert_eq!(
        f.kinds().await,
        [
            "turn_started",
            "budget_exhausted",
            "budget_parked",
            "turn_ended"
        ]
    );
    assert_eq!(
        f.of_kind("budget_exhausted").await[0]["before_first_call"],
        true
    );
    assert_eq!(f.of_kind("turn_ended").await[0]["outcome"], "parked");
    let view = seat_budget(&f).await;
    assert_eq!(view.day.spent, 20, "parked without a charge");
    assert!(view.day.refused_at.is_some(), "the refusal is recorded");
    let key = trigger::trigger_key(&assignment("d1"));
    assert!(matches!(f.coord.completed(&key).await, Ok(Answer::No(()))));
}

#[tokio::test]
async fn each_call_asks_for_no_more_tokens_than_the_room_left() {
    let f = Fixture::new(day_cap(5_000));
    f.script([
        Step::calls(vec![list_tools()]).cost(1_000, 500),
        Step::calls(vec![submit("no_action", "x")]),
        Step::calls(vec![review("done", "")]),
    ]);
    let end = f.run(&[assignment("d1")]).await;
    assert_eq!(outcome(&end), &Outcome::NoAction);
    let asked = f.brain.asked();
    let room = |spent: u64, a: &crate::script::Asked| {
        let prompt = estimate(&a.prompt.messages, &a.prompt.tools);
        (5_000 - spent - prompt).min(4_096) as u32
    };
    assert_eq!(asked[0].prompt.max_tokens, room(0, &asked[0]));
    assert_eq!(asked[1].prompt.max_tokens, room(1_500, &asked[1]));
    assert!(asked[1].prompt.max_tokens < 3_500);
    assert_eq!(asked[2].prompt.max_tokens, room(1_512, &asked[2]));
}

#[tokio::test]
async fn a_call_whose_prompt_would_overrun_the_room_is_not_made() {
    let f = Fixture::new(day_cap(5_000));
    f.script([
        Step::calls(vec![list_tools()]).cost(1_000, 500),
        Step::calls(vec![submit("no_action", "x")]),
    ]);
    // Leave less room than the first prompt needs, but some.
    let windows = windows_at(&f.active.company, crewlet_coord::Clock::now(&f.clock));
    let caps = Caps {
        day: Some(5_000),
        ..Caps::default()
    };
    f.coord
        .charge("ada", &windows, &Caps::default(), &caps, 4_990)
        .await
        .unwrap()
        .yes()
        .unwrap();
    let end = f.run(&[assignment("d1")]).await;
    let TurnEnd::Parked { park, .. } = &end else {
        panic!("not parked: {end:?}");
    };
    assert!(park.need > 10, "parked until the prompt fits: {park:?}");
    assert!(f.brain.asked().is_empty(), "no call was made");
    let refused = f.of_kind("budget_exhausted").await;
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0]["before_first_call"], true);
    let view = seat_budget(&f).await;
    assert_eq!(view.day.spent, 4_990, "nothing charged");
    assert!(view.day.refused_at.is_some(), "the refusal is recorded");
}

#[tokio::test]
async fn an_unreadable_counter_at_admission_is_an_outage_not_out_of_budget() {
    let f = Fixture::new(day_cap(20));
    f.script([Step::calls(vec![submit("no_action", "x")])]);
    f.faulty.break_store();
    let end = f.run(&[assignment("d1")]).await;
    let TurnEnd::Outage { reason, .. } = &end else {
        panic!("not an outage: {end:?}");
    };
    assert!(
        reason.starts_with("the budget counters are unreachable"),
        "{reason}"
    );
    assert!(f.brain.asked().is_empty());
    assert_eq!(f.kinds().await, ["turn_started", "turn_ended"]);
    assert_eq!(f.of_kind("turn_ended").await[0]["outcome"], "outage");
}

#[tokio::test]
async fn an_uncounted_charge_is_an_outage_not_out_of_budget() {
    let f = Fixture::new(day_cap(1_000));
    f.script([
        Step::calls(vec![list_tools()]),
        Step::calls(vec![submit("no_action", "x")]),
    ]);
    // The company's share lands; the seat's cannot be written.
    f.faulty.fail_writes_to(Some("seat."));
    let end = f.run(&[assignment("d1")]).await;
    let TurnEnd::Outage { reason, .. } = &end else {
        panic!("not an outage: {end:?}");
    };
    assert!(
        reason.starts_with("the budget counters are unreachable"),
        "{reason}"
    );
    assert_eq!(f.brain.asked().len(), 1, "no call after the unknown charge");
    assert!(f.of_kind("budget_exhausted").await.is_empty());
    f.faulty.heal();
    let key = trigger::trigger_key(&assignment("d1"));
    assert!(
        matches!(f.coord.completed(&key).await, Ok(Answer::No(()))),
        "an outage is not recorded as done"
    );
}

/// Fills ada's day window (cap `cap`) without a turn.
async fn fill_day(f: &Fixture, cap: u64) {
    let windows = windows_at(&f.active.company, crewlet_coord::Clock::now(&f.clock));
    let caps = Caps {
        day: Some(cap),
        ..Caps::default()
    };
    let full = f
        .coord
        .charge("ada", &windows, &Caps::default(), &caps, cap)
        .await;
    assert!(matches!(full, Ok(Answer::Yes(_))), "{full:?}");
}

fn announcing(cap: u64) -> Doc {
    Doc {
        announce_park: true,
        ..day_cap(cap)
    }
}

#[tokio::test]
async fn a_parks_notice_is_its_own_post_once_per_window_and_the_reply_is_still_owed() {
    let f = Fixture::new(announcing(5_000));
    fill_day(&f, 5_000).await;
    let wake = mention("d1");
    let end = f.run(std::slice::from_ref(&wake)).await;
    assert!(matches!(end, TurnEnd::Parked { .. }), "{end:?}");
    let posts = f.chat.posts();
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert_eq!(posts[0]["channel"], "C1");
    assert_eq!(posts[0]["thread"], "17.1");
    let text = posts[0]["text"].as_str().unwrap();
    assert!(
        text.contains("out of token budget (budget: day window until 2026-01-02T00:00:00+00:00)"),
        "{text}"
    );
    assert!(
        f.of_kind("reply_posted").await.is_empty(),
        "the notice is not the reply"
    );

    // The same wake again while the window is still full (a peer, a
    // re-fetch): parked, and nobody is told twice.
    let again = f.run(std::slice::from_ref(&wake)).await;
    assert!(matches!(again, TurnEnd::Parked { .. }), "{again:?}");
    assert_eq!(f.chat.posts().len(), 1, "{:?}", f.chat.posts());
    let parked = f.of_kind("budget_parked").await;
    assert_eq!(parked.len(), 2);
    assert_eq!(parked[0]["announced_to"], serde_json::json!(["C1#17.1"]));
    assert_eq!(parked[1]["announced_to"], serde_json::json!([]));
    assert!(f.brain.asked().is_empty(), "no model call while full");

    // The window turns over: the work runs, and the real answer is posted.
    f.clock.advance(Duration::from_secs(86_400));
    f.script([
        Step::calls(vec![post("C1", "17.1", "green"), submit("delivered", "x")]),
        Step::calls(vec![review("done", "")]),
    ]);
    let end = f.run(std::slice::from_ref(&wake)).await;
    assert_eq!(outcome(&end), &Outcome::Delivered);
    let texts: Vec<Value> = f.chat.posts().iter().map(|p| p["text"].clone()).collect();
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert_eq!(texts[1], "green");
    assert_eq!(f.of_kind("reply_posted").await.len(), 1);
}

#[tokio::test]
async fn a_parks_notice_goes_through_the_servers_notice_mapping() {
    // A vendor's server names its arguments its own way: the notice is
    // posted with them, the text in the `{text}` slot.
    let f = Fixture::new(Doc {
        chat_mapping: r#"notice = { tool = "post_message", arguments = { channel_id = "{channel}", thread_ts = "{thread}", payload = "{text}", content_type = "text/plain" } }"#,
        ..announcing(5_000)
    });
    fill_day(&f, 5_000).await;
    let end = f.run(&[mention("d1")]).await;
    assert!(matches!(end, TurnEnd::Parked { .. }), "{end:?}");
    let posts = f.chat.posts();
    assert_eq!(posts.len(), 1, "{posts:?}");
    let post = posts[0].as_object().unwrap();
    let mut keys: Vec<&str> = post.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        ["channel_id", "content_type", "payload", "thread_ts"],
        "{post:?}"
    );
    assert_eq!(post["channel_id"], "C1");
    assert_eq!(post["thread_ts"], "17.1");
    assert!(
        post["payload"]
            .as_str()
            .unwrap()
            .contains("out of token budget"),
        "{post:?}"
    );

    // `notice = false`: the seat tells nobody; the work stays parked.
    let f = Fixture::new(Doc {
        chat_mapping: "notice = false",
        ..announcing(5_000)
    });
    fill_day(&f, 5_000).await;
    let end = f.run(&[mention("d1")]).await;
    assert!(matches!(end, TurnEnd::Parked { .. }), "{end:?}");
    assert!(f.chat.posts().is_empty(), "{:?}", f.chat.posts());
    assert_eq!(
        f.of_kind("budget_parked").await[0]["announced_to"],
        serde_json::json!([])
    );
}

#[tokio::test]
async fn a_parks_notice_whose_key_cannot_be_recorded_is_not_posted() {
    let f = Fixture::new(announcing(5_000));
    fill_day(&f, 5_000).await;
    f.faulty.fail_writes_to(Some("reply."));
    let end = f.run(&[mention("d1")]).await;
    assert!(matches!(end, TurnEnd::Parked { .. }), "{end:?}");
    assert!(
        f.chat.posts().is_empty(),
        "unknown posts nothing: never twice"
    );
    assert_eq!(
        f.of_kind("budget_parked").await[0]["announced_to"],
        serde_json::json!([])
    );
    // The ledger answers again: the next run of the parked wake tells.
    f.faulty.heal();
    let end = f.run(&[mention("d1")]).await;
    assert!(matches!(end, TurnEnd::Parked { .. }), "{end:?}");
    assert_eq!(f.chat.posts().len(), 1);
}

#[tokio::test]
async fn a_parks_notice_the_tool_refused_is_posted_by_the_next_run() {
    let f = Fixture::new(announcing(5_000));
    fill_day(&f, 5_000).await;
    f.chat
        .refuse_posts
        .store(1, std::sync::atomic::Ordering::SeqCst);
    f.run(&[mention("d1")]).await;
    assert!(f.chat.landed.lock().unwrap().is_empty());
    f.run(&[mention("d1")]).await;
    f.run(&[mention("d1")]).await;
    assert_eq!(
        f.chat.landed.lock().unwrap().len(),
        1,
        "a refused notice frees its key; the one that landed holds it"
    );
}
