//! The turn's own calls on the seat's chat server: the thread read back
//! into the executor's first prompt, and the working indicator cleared on
//! every way a turn ends.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crewlet_turns::{Act, Outcome, TurnEnd};
use serde_json::{Value, json};

use crate::harness::{Doc, Fixture, Step, mention, post, review, submit};

fn answered(f: &Fixture) {
    f.script([
        Step::calls(vec![
            post("C1", "17.1", "green"),
            submit("delivered", "answered"),
        ]),
        Step::calls(vec![review("done", "ok")]),
    ]);
}

async fn payloads(f: &Fixture, kind: &str) -> Vec<Value> {
    f.events()
        .await
        .into_iter()
        .filter(|e| e.kind == kind)
        .map(|e| e.payload)
        .collect()
}

fn calls_of(f: &Fixture, tool: &str) -> Vec<Value> {
    f.chat
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(t, _)| t == tool)
        .map(|(_, a)| a.clone())
        .collect()
}

#[tokio::test]
async fn the_thread_is_read_back_into_the_executors_first_prompt() {
    let f = Fixture::new(Doc::default());
    *f.chat.thread.lock().unwrap() = Some(json!({"messages": [
        {"as": "U1", "channel": "C1", "thread": "17.1", "text": "the deploy failed at step 3"},
        {"as": "bob", "channel": "C1", "thread": "17.1", "text": "it is the cache again"},
    ]}));
    answered(&f);
    let TurnEnd::Ended { outcome, .. } = f.run(&[mention("d1")]).await else {
        panic!("the turn did not end");
    };
    assert_eq!(outcome, Outcome::Delivered);
    assert_eq!(
        calls_of(&f, "read_thread"),
        [json!({"channel": "C1", "thread": "17.1"})],
        "read once, where the wake came from"
    );
    let first = &f.brain.asked()[0].prompt.messages[0].content;
    assert!(
        first.contains("read through chat's read_thread")
            && first.contains("U1: the deploy failed at step 3\nbob: it is the cache again"),
        "{first}"
    );
    let read = payloads(&f, "thread_read").await;
    assert_eq!(read.len(), 1);
    assert_eq!(
        (&read[0]["status"], &read[0]["messages"], &read[0]["kept"]),
        (&json!("read"), &json!(2), &json!(2))
    );
}

/// Runs a delivered turn whose read-back goes wrong; its `thread_read`.
async fn delivered_without_the_thread(f: &Fixture, delivery: &str) -> Value {
    answered(f);
    let end = f.run(&[mention(delivery)]).await;
    assert!(
        matches!(
            &end,
            TurnEnd::Ended {
                outcome: Outcome::Delivered,
                ..
            }
        ),
        "{end:?}"
    );
    let first = &f.brain.asked()[0].prompt.messages[0].content;
    assert!(!first.contains("The thread you were woken in"), "{first}");
    let mut read = payloads(f, "thread_read").await;
    assert_eq!(read.len(), 1, "{read:?}");
    read.remove(0)
}

#[tokio::test]
async fn a_read_back_that_fails_or_times_out_leaves_the_turn_to_run_without_it() {
    let f = Fixture::new(Doc::default());
    f.chat.refuse_reads.store(true, Ordering::SeqCst);
    let read = delivered_without_the_thread(&f, "d1").await;
    assert_eq!(read["status"], "failed", "{read}");
    let error = read["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("read_thread refused: channel_not_found"),
        "{read}"
    );

    let f = Fixture::new(Doc {
        surface_timeout: Duration::from_millis(200),
        ..Doc::default()
    });
    f.chat.hang_reads.store(true, Ordering::SeqCst);
    let read = delivered_without_the_thread(&f, "d2").await;
    assert_eq!(read["status"], "timed_out", "{read}");
    let error = read["error"].as_str().unwrap_or_default();
    assert!(error.contains("did not answer within 200ms"), "{read}");
}

#[tokio::test]
async fn the_working_indicator_is_cleared_whatever_the_outcome() {
    let here = json!({"channel": "C1", "thread": "17.1"});
    // Delivered.
    let f = Fixture::new(Doc::default());
    f.chat.working.store(true, Ordering::SeqCst);
    answered(&f);
    f.run(&[mention("d1")]).await;
    assert_eq!(calls_of(&f, "raise_working"), std::slice::from_ref(&here));
    assert_eq!(calls_of(&f, "clear_working"), std::slice::from_ref(&here));
    let states: Vec<Value> = payloads(&f, "working_indicator")
        .await
        .iter()
        .map(|p| p["state"].clone())
        .collect();
    assert_eq!(states, [json!("raised"), json!("cleared")]);

    // Every model of the chain failed (the script is empty).
    let f = Fixture::new(Doc::default());
    f.chat.working.store(true, Ordering::SeqCst);
    let end = f.run(&[mention("d2")]).await;
    assert!(
        matches!(
            &end,
            TurnEnd::Ended {
                outcome: Outcome::LlmUnavailable(_),
                ..
            }
        ),
        "{end:?}"
    );
    assert_eq!(calls_of(&f, "clear_working").len(), 1);

    // Paused before its first model call.
    let f = Fixture::new(Doc::default());
    f.chat.working.store(true, Ordering::SeqCst);
    let end = f.run_fenced(&[mention("d3")], &|| Act::Paused).await;
    assert!(matches!(end, TurnEnd::Paused { .. }), "{end:?}");
    assert_eq!(calls_of(&f, "clear_working").len(), 1);

    // Dropped mid-turn (hanging in a post): the guard clears it on its own.
    let f = Fixture::new(Doc::default());
    f.chat.working.store(true, Ordering::SeqCst);
    f.chat.hang_posts.store(1, Ordering::SeqCst);
    answered(&f);
    f.crash(&[mention("d4")]).await;
    assert_eq!(calls_of(&f, "raise_working").len(), 1);
    assert_eq!(
        calls_of(&f, "clear_working"),
        [here],
        "cleared though the turn never ended"
    );
}
