//! Delivery is the engine's judgement, three ways.

use crewlet_bus::{ReplyTo, Wake};
use crewlet_coord::Answer;
use crewlet_turns::{Outcome, Phase, TurnEnd, trigger};

use crate::harness::{Doc, Fixture, Step, assignment, mention, outcome, post, review, submit};

const E: Phase = Phase::Executor;
const R: Phase = Phase::Reviewer;

#[tokio::test]
async fn a_claimed_delivery_with_nothing_posted_is_bounced_without_a_review_call() {
    let f = Fixture::new(Doc::default());
    f.script([
        Step::calls(vec![submit("delivered", "answered")]),
        Step::calls(vec![
            post("C1", "17.1", "green"),
            submit("delivered", "answered"),
        ]),
        Step::calls(vec![review("done", "")]),
    ]);
    let end = f.run(&[mention("d1")]).await;
    assert_eq!(outcome(&end), &Outcome::Delivered);
    // The bounce is a tool answer in the same iteration, not a review.
    assert_eq!(f.brain.phases(), [E, E, R]);
    let asked = f.brain.asked();
    assert_eq!(asked[1].iteration, 1);
    assert!(
        asked[1]
            .last()
            .starts_with("Refused: you claim delivery, but nothing was posted to C1#17.1"),
        "{}",
        asked[1].last()
    );
    let tools: Vec<_> = f
        .of_kind("tool_call")
        .await
        .into_iter()
        .map(|p| {
            (
                p["tool"].as_str().unwrap().to_owned(),
                p["ok"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        tools,
        [
            ("submit_work".to_owned(), false),
            ("chat__post_message".to_owned(), true),
            ("submit_work".to_owned(), true),
        ]
    );
}

#[tokio::test]
async fn a_round_of_text_only_loops_back_without_a_review_call() {
    let f = Fixture::new(Doc::default());
    f.script([
        Step::text("I will look into it."),
        Step::calls(vec![submit("no_action", "nothing to change")]),
        Step::calls(vec![review("done", "")]),
    ]);
    let end = f.run(&[assignment("d1")]).await;
    assert_eq!(outcome(&end), &Outcome::NoAction);
    assert_eq!(f.brain.phases(), [E, E, R]);
    let asked = f.brain.asked();
    assert_eq!(asked[1].iteration, 2, "the text round used an iteration");
    assert!(asked[1].last().contains("Text is not seen by anyone"));
}

#[tokio::test]
async fn a_done_review_is_overturned_when_the_owed_reply_was_not_posted() {
    let f = Fixture::new(Doc::default());
    f.script([
        Step::calls(vec![submit("no_action", "nothing to say")]),
        Step::calls(vec![review("done", "fine")]),
        Step::calls(vec![
            post("C1", "17.1", "green"),
            submit("delivered", "answered"),
        ]),
        Step::calls(vec![review("done", "")]),
    ]);
    let end = f.run(&[mention("d1")]).await;
    assert_eq!(outcome(&end), &Outcome::Delivered);
    assert_eq!(f.brain.phases(), [E, R, E, R]);
    assert!(
        f.brain.asked()[2]
            .last()
            .starts_with("The review said done, but someone is waiting for your reply in C1#17.1")
    );
    let overturned = f.of_kind("review_overturned").await;
    assert_eq!(overturned.len(), 1);
    assert_eq!(overturned[0]["iteration"], 1);
    assert_eq!(f.of_kind("turn_ended").await[0]["iterations"], 2);
}

#[tokio::test]
async fn a_posted_reply_and_a_done_review_deliver_once_and_are_recorded() {
    let f = Fixture::new(Doc::default());
    f.script([
        Step::calls(vec![
            post("C1", "17.1", "green"),
            submit("delivered", "answered"),
        ]),
        Step::calls(vec![review("done", "")]),
    ]);
    let wakes = [mention("d1")];
    let TurnEnd::Ended { turn_id, outcome } = f.run(&wakes).await else {
        panic!("the turn did not end");
    };
    assert_eq!(outcome, Outcome::Delivered);
    assert_eq!(
        f.chat.posts(),
        [serde_json::json!({"channel": "C1", "thread": "17.1", "text": "green"})]
    );
    // The reviewer judged the record of what ran.
    let brief = &f.brain.asked()[1].prompt.messages[1].content;
    assert!(brief.contains("- chat__post_message("), "{brief}");
    assert!(brief.contains("→ ok: ok"), "{brief}");
    // The ledger and the session remember it.
    let key = trigger::trigger_key(&wakes[0]);
    assert!(matches!(f.coord.completed(&key).await, Ok(Answer::Yes(()))));
    let said = f.sessions.0.lock().unwrap()[&("ada".to_owned(), "C1#17.1".to_owned())].clone();
    assert_eq!(said.len(), 1);
    assert_eq!(
        (said[0].turn_id.as_str(), said[0].text.as_str()),
        (turn_id.as_str(), "green")
    );
    // A redelivery is already done: no call, no post.
    assert_eq!(f.run(&wakes).await, TurnEnd::AlreadyDone);
    assert_eq!(f.brain.asked().len(), 2);
    assert_eq!(f.chat.posts().len(), 1);
}

#[tokio::test]
async fn a_failed_post_is_explained_to_the_model_and_in_its_event_and_is_not_delivery() {
    let f = Fixture::new(Doc::default());
    f.chat
        .refuse_posts
        .store(1, std::sync::atomic::Ordering::SeqCst);
    f.script([
        Step::calls(vec![
            post("C1", "17.1", "green"),
            submit("delivered", "answered"),
        ]),
        Step::calls(vec![
            post("C1", "17.1", "green"),
            submit("delivered", "answered"),
        ]),
        Step::calls(vec![review("done", "")]),
    ]);
    let end = f.run(&[mention("d1")]).await;
    assert_eq!(outcome(&end), &Outcome::Delivered, "after the second post");
    // The model read what failed, by the tool's offered name, and that its
    // claim of delivery was refused for it.
    let second = &f.brain.asked()[1].prompt.messages;
    let answers: Vec<&str> = second
        .iter()
        .filter(|m| m.call_id.is_some())
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(
        answers[0], "chat__post_message failed: channel_not_found",
        "{answers:?}"
    );
    assert!(
        answers[1].starts_with("Refused: you claim delivery, but nothing was posted to C1#17.1"),
        "{answers:?}"
    );
    // The event carries the reason; a call that worked carries none.
    let calls = f.of_kind("tool_call").await;
    assert_eq!(calls[0]["ok"], false);
    assert_eq!(
        calls[0]["error"],
        "chat__post_message failed: channel_not_found"
    );
    assert!(calls[1]["error"].as_str().unwrap().starts_with("Refused:"));
    assert_eq!(calls[2]["ok"], true);
    assert!(calls[2].get("error").is_none(), "{}", calls[2]);
    // Each call's arguments, and a call that worked its answer, travel
    // with it (clipped) for the turn's timeline.
    assert!(
        calls[0]["arguments"].as_str().unwrap().contains("C1"),
        "{}",
        calls[0]
    );
    assert!(calls[0].get("result").is_none(), "{}", calls[0]);
    assert!(calls[2]["result"].is_string(), "{}", calls[2]);
}

#[tokio::test]
async fn a_batch_owing_two_threads_is_not_delivered_until_both_are_answered() {
    let f = Fixture::new(Doc::default());
    let other = Wake {
        conversation: Some("C1#17.2".into()),
        thread: Some("17.2".into()),
        owed: Some(ReplyTo {
            channel: "C1".into(),
            thread: Some("17.2".into()),
        }),
        ..mention("d2")
    };
    f.script([
        Step::calls(vec![
            post("C1", "17.1", "green"),
            submit("delivered", "answered"),
        ]),
        Step::calls(vec![
            post("C1", "17.2", "green too"),
            submit("delivered", "answered both"),
        ]),
        Step::calls(vec![review("done", "")]),
    ]);
    let end = f.run(&[mention("d1"), other]).await;
    assert_eq!(outcome(&end), &Outcome::Delivered);
    assert_eq!(f.brain.phases(), [E, E, R], "the first claim was bounced");
    assert!(
        f.brain.asked()[1]
            .last()
            .starts_with("Refused: you claim delivery, but nothing was posted to C1#17.2"),
        "{}",
        f.brain.asked()[1].last()
    );
    assert_eq!(f.chat.posts().len(), 2);
}
