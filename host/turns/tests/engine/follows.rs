//! Follows: a post that lands in a thread follows it (on the wake's
//! surface), `leave_thread` leaves it, and a follow the store could not
//! write leaves the post standing and says so in `reply_posted`.

use crewlet_coord::ChatThread;
use crewlet_turns::Outcome;
use serde_json::json;

use crate::harness::{Doc, Fixture, Step, leave_thread, mention, outcome, post, review, submit};

fn slack(channel: &str, thread: &str) -> ChatThread {
    ChatThread::new("slack", channel, thread)
}

#[tokio::test]
async fn a_post_in_a_thread_follows_it_until_the_seat_leaves() {
    let f = Fixture::new(Doc::default());
    let follows = f.coord.follows();
    f.script([
        Step::calls(vec![post("C1", "17.1", "green")]),
        Step::calls(vec![submit("delivered", "answered")]),
        Step::calls(vec![review("done", "")]),
    ]);
    assert_eq!(outcome(&f.run(&[mention("d1")]).await), &Outcome::Delivered);
    assert_eq!(
        follows.followers(&slack("C1", "17.1")).await.unwrap(),
        ["ada"]
    );
    let posted = f.of_kind("reply_posted").await;
    assert_eq!(posted[0]["follows"], "slack:C1#17.1", "{posted:?}");

    // Leaving without arguments leaves the thread that woke the turn; a
    // thread named leaves that one; one never followed changes nothing.
    follows.follow(&slack("C1", "18.1"), "ada").await.unwrap();
    f.script([
        Step::calls(vec![
            leave_thread(json!({})),
            leave_thread(json!({"channel": "C1", "thread": "18.1"})),
            leave_thread(json!({"channel": "C1", "thread": "19.1"})),
            leave_thread(json!({"channel": "C1"})),
        ]),
        Step::calls(vec![submit("no_action", "left")]),
        Step::calls(vec![review("done", "")]),
    ]);
    let mut wake = mention("d2");
    wake.owed = None;
    f.run(&[wake]).await;
    for t in ["17.1", "18.1"] {
        assert!(
            follows.followers(&slack("C1", t)).await.unwrap().is_empty(),
            "{t}"
        );
    }
    // The second turn's second executor call reads the four answers.
    let asked = f.brain.asked();
    let answers: Vec<String> = asked[asked.len() - 2]
        .prompt
        .messages
        .iter()
        .filter(|m| m.call_id.is_some())
        .map(|m| m.content.clone())
        .collect();
    assert!(
        answers[0].contains("no longer follow C1#17.1"),
        "{answers:?}"
    );
    assert!(
        answers[1].contains("no longer follow C1#18.1"),
        "{answers:?}"
    );
    assert!(answers[2].contains("did not follow C1#19.1"), "{answers:?}");
    assert!(
        answers[3].contains("needs a `channel` and a `thread`"),
        "{answers:?}"
    );
}

#[tokio::test]
async fn a_follow_the_store_could_not_write_leaves_the_post_standing() {
    let f = Fixture::new(Doc::default());
    // The thread's key in the follows bucket, and no other key.
    f.faulty.fail_writes_to(Some("slack.C1.17_2E1"));
    f.script([
        Step::calls(vec![post("C1", "17.1", "green")]),
        Step::calls(vec![submit("delivered", "answered")]),
        Step::calls(vec![review("done", "")]),
    ]);
    assert_eq!(outcome(&f.run(&[mention("d1")]).await), &Outcome::Delivered);
    assert_eq!(f.chat.posts().len(), 1);
    let posted = f.of_kind("reply_posted").await;
    assert!(posted[0]["follow_error"].is_string(), "{posted:?}");
    f.faulty.heal();
    let followers = f.coord.follows().followers(&slack("C1", "17.1")).await;
    assert!(followers.unwrap().is_empty());
}
