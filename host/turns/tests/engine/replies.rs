//! The reply key: at most one post per turn and target.

use std::sync::atomic::Ordering;

use crewlet_coord::Answer;
use crewlet_turns::{Outcome, TurnEnd, trigger};

use crate::harness::{Doc, Fixture, Step, mention, outcome, post, review, submit};

#[tokio::test]
async fn the_reply_key_refuses_a_second_post_in_the_same_turn() {
    let f = Fixture::new(Doc::default());
    f.script([
        Step::calls(vec![post("C1", "17.1", "green")]),
        Step::calls(vec![
            post("C1", "17.1", "green, again"),
            submit("delivered", "answered"),
        ]),
        Step::calls(vec![review("done", "")]),
    ]);
    let end = f.run(&[mention("d1")]).await;
    assert_eq!(outcome(&end), &Outcome::Delivered);
    assert_eq!(f.chat.posts().len(), 1, "posted once");
    let answer = &f.brain.asked()[2].prompt.messages[1].content;
    assert!(
        answer.contains("Already posted to C1#17.1 in this turn; not posted again."),
        "{answer}"
    );
    assert_eq!(f.of_kind("reply_posted").await.len(), 1);
}

#[tokio::test]
async fn a_rerun_of_a_turn_whose_completion_was_lost_does_not_post_again() {
    let f = Fixture::new(Doc::default());
    let wake = mention("d1");
    let key = trigger::trigger_key(&wake);
    let answered = || {
        [
            Step::calls(vec![
                post("C1", "17.1", "green"),
                submit("delivered", "answered"),
            ]),
            Step::calls(vec![review("done", "")]),
        ]
    };
    f.script(answered());
    f.faulty
        .fail_writes_to(Some(&crewlet_coord::names::encode_token(&key)));
    let first = f.run(std::slice::from_ref(&wake)).await;
    assert_eq!(outcome(&first), &Outcome::Delivered);
    f.faulty.heal();
    assert!(matches!(f.coord.completed(&key).await, Ok(Answer::No(()))));

    f.script(answered());
    let second = f.run(&[wake]).await;
    assert_eq!(
        outcome(&second),
        &Outcome::Delivered,
        "the key counts as posted"
    );
    assert_eq!(f.chat.posts().len(), 1, "not posted again");
    let TurnEnd::Ended { turn_id: a, .. } = first else {
        unreachable!()
    };
    let TurnEnd::Ended { turn_id: b, .. } = second else {
        unreachable!()
    };
    assert_eq!(a, b, "the same triggers are the same turn");
}

#[tokio::test]
async fn an_unknown_reply_key_posts_nothing_and_is_an_outage() {
    let f = Fixture::new(Doc::default());
    let wake = mention("d1");
    f.script([Step::calls(vec![
        post("C1", "17.1", "green"),
        submit("delivered", "x"),
    ])]);
    f.faulty.fail_writes_to(Some("reply."));
    let end = f.run(std::slice::from_ref(&wake)).await;
    let TurnEnd::Outage { reason, .. } = &end else {
        panic!("not an outage: {end:?}");
    };
    assert!(
        reason.starts_with("cannot record the reply key for C1#17.1"),
        "{reason}"
    );
    assert!(f.chat.posts().is_empty(), "never posted without its key");
    f.faulty.heal();
    let key = trigger::trigger_key(&wake);
    assert!(matches!(f.coord.completed(&key).await, Ok(Answer::No(()))));
}

#[tokio::test]
async fn a_refused_post_frees_the_key_for_a_corrected_attempt() {
    let f = Fixture::new(Doc::default());
    f.chat.refuse_posts.store(1, Ordering::SeqCst);
    f.script([
        Step::calls(vec![post("C1", "17.1", "green")]),
        Step::calls(vec![
            post("C1", "17.1", "green"),
            submit("delivered", "answered"),
        ]),
        Step::calls(vec![review("done", "")]),
    ]);
    let end = f.run(&[mention("d1")]).await;
    assert_eq!(outcome(&end), &Outcome::Delivered);
    assert_eq!(
        f.chat.posts().len(),
        2,
        "the refused post, then the corrected one"
    );
    assert_eq!(f.of_kind("reply_posted").await.len(), 1);
}
