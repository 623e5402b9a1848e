//! Reply keys: a reply a trigger is owed is posted once per trigger, across
//! crashes and re-batching; any other post at most once per turn and target.

use std::sync::atomic::Ordering;

use crewlet_coord::Answer;
use crewlet_turns::{Outcome, TurnEnd, trigger};
use serde_json::Value;

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
        answer.contains("Already answered in C1#17.1; not posted again."),
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
async fn a_model_key_not_known_yet_is_an_outage_and_the_trigger_runs_again() {
    let f = Fixture::new(Doc::default());
    let wake = mention("d1");
    f.script([Step::key_unknown()]);
    let end = f.run(std::slice::from_ref(&wake)).await;
    let TurnEnd::Outage { reason, .. } = &end else {
        panic!("not an outage: {end:?}");
    };
    assert!(reason.contains("not known yet"), "{reason}");
    let key = trigger::trigger_key(&wake);
    assert!(
        matches!(f.coord.completed(&key).await, Ok(Answer::No(()))),
        "not completed: the wake is handed back, not dropped"
    );
    f.script([
        Step::calls(vec![post("C1", "17.1", "green"), submit("delivered", "x")]),
        Step::calls(vec![review("done", "")]),
    ]);
    let end = f.run(std::slice::from_ref(&wake)).await;
    assert_eq!(outcome(&end), &Outcome::Delivered);
    assert_eq!(f.chat.posts().len(), 1);
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

/// The script of a turn that posts its reply, submits and is reviewed done.
fn answers(text: &str) -> [Step; 2] {
    [
        Step::calls(vec![
            post("C1", "17.1", text),
            submit("delivered", "answered"),
        ]),
        Step::calls(vec![review("done", "")]),
    ]
}

/// A node killed between the intent and the post (or after the post, before
/// its completion): the next run finishes the recorded call through the
/// surface, which dedupes — one post either way, and it is the one the
/// first run meant.
#[tokio::test]
async fn an_intent_left_by_a_crash_is_finished_once_through_a_surface_that_dedupes() {
    for landed_before_the_crash in [false, true] {
        let f = Fixture::new(Doc::default());
        f.chat.idempotent.store(true, Ordering::SeqCst);
        f.chat.hang_posts.store(1, Ordering::SeqCst);
        f.chat
            .land_then_hang
            .store(landed_before_the_crash, Ordering::SeqCst);
        let wake = mention("d1");
        f.script(answers("green"));
        f.crash(std::slice::from_ref(&wake)).await;
        assert_eq!(
            f.chat.landed.lock().unwrap().len(),
            usize::from(landed_before_the_crash)
        );

        f.script(answers("green, said again"));
        let end = f.run(&[wake]).await;
        assert_eq!(outcome(&end), &Outcome::Delivered);
        let landed = f.chat.landed.lock().unwrap().clone();
        assert_eq!(landed.len(), 1, "posted exactly once: {landed:?}");
        assert_eq!(landed[0]["text"], "green", "the reply the first run meant");
        let posted = f.of_kind("reply_posted").await;
        assert_eq!(posted.len(), 1, "{posted:?}");
        assert!(posted[0]["recovered_from"].is_string(), "{posted:?}");
        let prompt = &f.brain.asked()[1].prompt.messages[0].content;
        assert!(
            prompt.contains("Already answered, by an earlier run of this work (do not answer there again): C1#17.1."),
            "{prompt}"
        );
    }
}

/// The same crash on a surface that cannot be asked: the reply may or may
/// not be there, so it is not posted again and the turn says so — never
/// `delivered`.
#[tokio::test]
async fn an_intent_on_a_surface_that_cannot_be_asked_ends_reply_uncertain() {
    let f = Fixture::new(Doc::default());
    f.chat.hang_posts.store(1, Ordering::SeqCst);
    f.chat.land_then_hang.store(true, Ordering::SeqCst);
    let wake = mention("d1");
    f.script(answers("green"));
    f.crash(std::slice::from_ref(&wake)).await;

    f.script(answers("green, said again"));
    let end = f.run(std::slice::from_ref(&wake)).await;
    assert_eq!(outcome(&end), &Outcome::ReplyUncertain("C1#17.1".into()));
    assert_eq!(f.chat.landed.lock().unwrap().len(), 1, "not posted again");
    let uncertain = f.of_kind("reply_uncertain").await;
    assert_eq!(uncertain.len(), 1, "{uncertain:?}");
    assert_eq!(uncertain[0]["target"], "C1#17.1");
    assert_eq!(uncertain[0]["trigger"], trigger::trigger_key(&wake));
    let ended = f.of_kind("turn_ended").await;
    assert_eq!(ended.last().unwrap()["outcome"], "reply_uncertain");
    // The turn ended (the operator has the event to act on): a redelivery
    // runs nothing and posts nothing.
    assert_eq!(f.run(&[wake]).await, TurnEnd::AlreadyDone);
    assert_eq!(f.chat.landed.lock().unwrap().len(), 1);
}

/// w1's turn posted, then the node died before the turn was recorded done;
/// w2 of the same thread came meanwhile, and both run as one new turn: w1's
/// reply is not posted again, w2 gets its own.
#[tokio::test]
async fn a_trigger_answered_before_a_crash_is_not_answered_again_in_a_new_batch() {
    let f = Fixture::new(Doc::default());
    let (w1, w2) = (mention("d1"), mention("d2"));
    f.script(answers("green"));
    f.faulty
        .fail_writes_to(Some(&crewlet_coord::names::encode_token(
            &trigger::trigger_key(&w1),
        )));
    let first = f.run(std::slice::from_ref(&w1)).await;
    assert_eq!(outcome(&first), &Outcome::Delivered);
    f.faulty.heal();

    f.script(answers("and yes, it deploys too"));
    let second = f.run(&[w1, w2]).await;
    assert_eq!(outcome(&second), &Outcome::Delivered);
    let posts: Vec<Value> = f.chat.landed.lock().unwrap().clone();
    let texts: Vec<&str> = posts.iter().filter_map(|p| p["text"].as_str()).collect();
    assert_eq!(
        texts,
        ["green", "and yes, it deploys too"],
        "one reply per trigger"
    );
    let (TurnEnd::Ended { turn_id: a, .. }, TurnEnd::Ended { turn_id: b, .. }) = (&first, &second)
    else {
        unreachable!()
    };
    assert_ne!(a, b, "a new batch is a new turn");
}
