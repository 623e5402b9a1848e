//! The loop's bounds: `max_tool_rounds`, `max_iterations`, the fence, a
//! pause.

use std::sync::atomic::{AtomicUsize, Ordering};

use crewlet_turns::{Act, Outcome, Phase, TurnEnd};

use crate::harness::{Doc, Fixture, Step, assignment, list_tools, outcome, review, submit};

#[tokio::test]
async fn max_tool_rounds_bounds_each_iteration_without_a_review_call() {
    let f = Fixture::new(Doc {
        max_iterations: 2,
        max_tool_rounds: 2,
        ..Doc::default()
    });
    f.script((0..5).map(|_| Step::calls(vec![list_tools()])));
    let end = f.run(&[assignment("d1")]).await;
    assert_eq!(
        outcome(&end),
        &Outcome::Failed("no accepted result after 2 iteration(s)".into())
    );
    let asked = f.brain.asked();
    let calls: Vec<(Phase, u32)> = asked.iter().map(|a| (a.phase, a.iteration)).collect();
    assert_eq!(
        calls,
        [
            (Phase::Executor, 1),
            (Phase::Executor, 1),
            (Phase::Executor, 2),
            (Phase::Executor, 2),
        ]
    );
    assert!(
        asked[2]
            .last()
            .starts_with("You used all 2 tool rounds of this iteration without submit_work"),
        "{}",
        asked[2].last()
    );
    assert_eq!(f.brain.unused(), 1, "no call past the bound");
}

#[tokio::test]
async fn max_iterations_bounds_the_reviewed_attempts() {
    let f = Fixture::new(Doc {
        max_iterations: 2,
        ..Doc::default()
    });
    f.script([
        Step::calls(vec![submit("no_action", "looks fine")]),
        Step::calls(vec![review("iterate", "add a test")]),
        Step::calls(vec![submit("no_action", "still fine")]),
        Step::calls(vec![review("iterate", "the test is missing")]),
        Step::calls(vec![submit("no_action", "one more")]),
    ]);
    let end = f.run(&[assignment("d1")]).await;
    assert_eq!(
        outcome(&end),
        &Outcome::Failed("no accepted result after 2 iteration(s)".into())
    );
    assert_eq!(
        f.brain.phases(),
        [
            Phase::Executor,
            Phase::Reviewer,
            Phase::Executor,
            Phase::Reviewer
        ]
    );
    assert_eq!(
        f.brain.asked()[2].last(),
        "The review asks for another round: add a test"
    );
    assert_eq!(f.brain.asked()[1].model, "rev", "the reviewer's own model");
    let verdicts: Vec<_> = f
        .of_kind("review")
        .await
        .into_iter()
        .map(|p| p["verdict"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(verdicts, ["iterate", "iterate"]);
}

#[tokio::test]
async fn a_lost_fence_stops_before_the_next_call() {
    let f = Fixture::new(Doc::default());
    f.script([Step::calls(vec![submit("no_action", "x")])]);
    let end = f.run_fenced(&[assignment("d1")], &|| Act::FenceLost).await;
    assert!(matches!(end, TurnEnd::FenceLost { .. }), "{end:?}");
    assert!(f.brain.asked().is_empty());
    assert_eq!(f.of_kind("turn_ended").await[0]["outcome"], "fence_lost");
}

#[tokio::test]
async fn a_pause_stops_the_turn_before_its_next_model_call_not_done() {
    let f = Fixture::new(Doc::default());
    f.script([
        Step::calls(vec![list_tools()]),
        Step::calls(vec![submit("no_action", "x")]),
    ]);
    // The operator pauses the seat while its first model call is answered.
    let asked = AtomicUsize::new(0);
    let may_act = || match asked.fetch_add(1, Ordering::SeqCst) {
        0 => Act::Go,
        _ => Act::Paused,
    };
    let end = f.run_fenced(&[assignment("d1")], &may_act).await;
    assert!(matches!(end, TurnEnd::Paused { .. }), "{end:?}");
    assert_eq!(f.brain.asked().len(), 1, "no model call after the pause");
    assert_eq!(f.brain.unused(), 1);
    assert_eq!(f.of_kind("turn_ended").await[0]["outcome"], "paused");
    // Not done: the same trigger runs again once the seat is resumed.
    f.script([Step::calls(vec![submit("no_action", "x")])]);
    let again = f.run(&[assignment("d1")]).await;
    assert!(matches!(again, TurnEnd::Ended { .. }), "{again:?}");
}
