//! Every step an event, in the order it happened.

use crewlet_turns::{Clock, Outcome, TurnEnd};
use serde_json::json;

use crate::harness::{Calendar, Doc, Fixture, Step, list_tools, mention, post, review, submit};

#[tokio::test]
async fn every_step_is_emitted_in_order() {
    let f = Fixture::new(Doc::default());
    f.script([
        Step::calls(vec![list_tools()]).cost(100, 10),
        Step::calls(vec![
            post("C1", "17.1", "green"),
            submit("delivered", "answered"),
        ])
        .cost(200, 20),
        Step::calls(vec![review("done", "ok")]).cost(50, 5),
    ]);
    let TurnEnd::Ended { turn_id, outcome } = f.run(&[mention("d1")]).await else {
        panic!("the turn did not end");
    };
    assert_eq!(outcome, Outcome::Delivered);
    let events = f.events().await;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            "turn_started",
            "working_indicator",
            "thread_read",
            "model_call",
            "tool_call",
            "model_call",
            "reply_posted",
            "tool_call",
            "tool_call",
            "model_call",
            "review",
            "turn_ended",
        ]
    );
    let at = Calendar(f.clock.clone()).now_ms();
    for e in &events {
        assert_eq!(e.payload["turn_id"], turn_id.as_str(), "{}", e.kind);
        assert_eq!(e.seat, "ada");
        assert_eq!(e.trace_id.as_deref(), Some("trace-d1"));
        assert_eq!(e.conversation.as_deref(), Some("C1#17.1"));
        assert_eq!(e.at_ms, at, "stamped on the engine's clock");
        if e.kind == "model_call" {
            assert!(
                e.payload["slot"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("scripted/") && s.ends_with("#keyless")),
                "a model call names the slot that served it: {}",
                e.payload
            );
        }
    }
    let p = |i: usize| &events[i].payload;
    assert_eq!(p(0)["owes_reply"], "C1#17.1");
    assert_eq!(
        (&p(1)["state"], &p(2)["status"], &p(2)["server"]),
        (&json!("not_offered"), &json!("read"), &json!("chat")),
        "this chat has no working indicator; it reads threads"
    );
    assert_eq!(p(0)["triggers"], json!(["slack:d1:ada"]));
    let calls: Vec<_> = [3, 5, 9]
        .iter()
        .map(|&i| {
            (
                p(i)["phase"].clone(),
                p(i)["round"].clone(),
                p(i)["model"].clone(),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            (json!("executor"), json!(1), json!("scripted/exec")),
            (json!("executor"), json!(2), json!("scripted/exec")),
            (json!("reviewer"), json!(1), json!("scripted/rev")),
        ]
    );
    assert_eq!(
        p(5)["tool_calls"],
        json!(["chat__post_message", "submit_work"])
    );
    assert_eq!(p(6)["target"], "C1#17.1");
    assert_eq!(p(6)["text"], "green");
    let tools: Vec<_> = [4, 7, 8].iter().map(|&i| p(i)["tool"].clone()).collect();
    assert_eq!(
        tools,
        [
            json!("list_mcp_server_tools"),
            json!("chat__post_message"),
            json!("submit_work")
        ]
    );
    assert_eq!(p(10)["verdict"], "done");
    let ended = p(11);
    assert_eq!(ended["outcome"], "delivered");
    assert_eq!(
        (
            &ended["iterations"],
            &ended["model_calls"],
            &ended["tool_calls"],
            &ended["replies"],
            &ended["input_tokens"],
            &ended["output_tokens"],
        ),
        (
            &json!(1),
            &json!(3),
            &json!(3),
            &json!(1),
            &json!(350),
            &json!(35)
        )
    );
}
