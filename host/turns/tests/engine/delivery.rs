//! Delivery is the engine's judgement, three ways.

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
