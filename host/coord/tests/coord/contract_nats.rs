//! The contract suite against a single real nats-server.
use crate::contract;

contract_suite!(contract::fixtures::Real::single());

/// 10,000 follows for one seat: who follows one of its threads is one
/// request to the store — a leader read of the thread's key — never a
/// listing that grows with the seat's follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_follows_for_one_seat_cost_a_thread_one_read() {
    use contract::fixtures::Fixture;
    use crewlet_coord::{Bucket, ChatThread};
    use futures::StreamExt;
    use std::time::Duration;

    let f = contract::fixtures::Real::single().await;
    let follows = f.coord(0).follows();
    let threads: Vec<ChatThread> = (0..10_000)
        .map(|i| ChatThread::new("slack", "C0BUSY", format!("1700000000.{i:06}")))
        .collect();
    futures::stream::iter(&threads)
        .for_each_concurrent(64, |t| {
            let follows = &follows;
            async move {
                follows.follow(t, "ada").await.expect("a follow lands");
            }
        })
        .await;

    // Every request to the store's API, as the server sees it.
    let sniffer = contract::fixtures::connect(&f.urls()[0]).await;
    let mut api = sniffer.subscribe("$JS.API.>").await.unwrap();
    sniffer.flush().await.unwrap();
    assert_eq!(
        follows.followers(&threads[4321]).await.unwrap(),
        ["ada"],
        "the seat follows the thread"
    );
    // The read was answered, so the server has routed it; its copy reaches
    // the sniffer when that connection is next served, which a loaded
    // machine can delay well past the quiet window below (a CI run saw
    // nothing within 500 ms): the first copy is waited for on a generous
    // bound, then anything after it until the API has been quiet a while.
    let mut asked = Vec::new();
    if let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(20), api.next()).await {
        asked.push(m.subject.to_string());
    }
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(500), api.next()).await {
        asked.push(m.subject.to_string());
    }
    let stream = f.nats(0).stream_name(Bucket::Follows).unwrap();
    assert_eq!(
        asked,
        [format!("$JS.API.STREAM.MSG.GET.{stream}")],
        "one leader read of the thread's key"
    );
}
