//! The completion ledger: unknown is not "done".

use std::sync::atomic::Ordering;

use crewlet_coord::Answer;
use crewlet_turns::{Outcome, TurnEnd, trigger};

use crate::harness::{Doc, Fixture, Step, assignment, outcome, review, submit};

#[tokio::test]
async fn an_unknown_ledger_does_the_work() {
    let f = Fixture::new(Doc::default());
    let wake = assignment("d1");
    let key = trigger::trigger_key(&wake);
    // The trigger was served, but the ledger cannot say so now.
    f.coord.complete(&key).await.expect("complete");
    f.ledger.blind.store(true, Ordering::SeqCst);
    f.script([
        Step::calls(vec![submit("no_action", "nothing to change")]),
        Step::calls(vec![review("done", "")]),
    ]);
    let end = f.run(std::slice::from_ref(&wake)).await;
    assert_eq!(outcome(&end), &Outcome::NoAction);
    assert_eq!(f.brain.asked().len(), 2);
    let started = f.of_kind("turn_started").await;
    assert_eq!(started[0]["triggers"], serde_json::json!([key]));

    // Once the ledger answers again, the same trigger is done.
    f.ledger.blind.store(false, Ordering::SeqCst);
    assert!(matches!(f.coord.completed(&key).await, Ok(Answer::Yes(()))));
    assert_eq!(f.run(&[wake]).await, TurnEnd::AlreadyDone);
    assert_eq!(f.brain.asked().len(), 2);
}

#[tokio::test]
async fn only_the_triggers_not_yet_done_are_served() {
    let f = Fixture::new(Doc::default());
    let (done, fresh) = (assignment("d1"), assignment("d2"));
    f.coord
        .complete(&trigger::trigger_key(&done))
        .await
        .expect("complete");
    f.script([
        Step::calls(vec![submit("no_action", "x")]),
        Step::calls(vec![review("done", "")]),
    ]);
    let TurnEnd::Ended { turn_id, .. } = f.run(&[done, fresh.clone()]).await else {
        panic!("the turn did not end");
    };
    let key = trigger::trigger_key(&fresh);
    assert_eq!(turn_id, trigger::turn_id(std::slice::from_ref(&key)));
    let brief = &f.brain.asked()[0].prompt.messages[1].content;
    assert!(brief.contains("\"delivery_id\":\"d2\""), "{brief}");
    assert!(!brief.contains("\"delivery_id\":\"d1\""), "{brief}");
}
