//! The contract suite against a 3-node nats-server cluster on loopback,
//! every handle on a different member.
use crate::contract;

contract_suite!(contract::fixtures::Real::cluster());

/// Buckets opened on the cluster take a write at once, through a member
/// that is not the meta leader. A fresh-clone CI run found the race this
/// holds shut: the stream existed, but the first write through another
/// member found no stream listening on its subject yet
/// (`publish ack: no stream found for given subject`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_buckets_take_a_write_at_once_through_a_follower() {
    use crewlet_coord::kv::Expect;
    use crewlet_coord::{Bucket, Kv, NatsKv};

    let cluster = contract::fixtures::shared_cluster();
    let url = tokio::task::spawn_blocking(move || {
        (0..crewlet_testkit::cluster::CLUSTER_SIZE)
            .find(|&i| {
                crewlet_testkit::cluster::meta_leader(cluster.member(i).spec().monitor_port)
                    .is_some_and(|leader| leader != cluster.server_name(i))
            })
            .map(|i| cluster.url(i))
            .expect("a member that is not the meta leader")
    })
    .await
    .unwrap();
    for round in 0..12 {
        let opts = contract::fixtures::suite_options(&contract::fixtures::namespace(), 3);
        let client = contract::fixtures::connect(&url).await;
        let kv = NatsKv::open(
            client,
            &opts.namespace,
            &Bucket::ALL,
            &contract::fixtures::retentions(&opts),
            opts.replicas,
            opts.request_timeout,
        )
        .await
        .expect("open buckets");
        let writes = futures::future::join_all(Bucket::ALL.map(|b| {
            let kv = &kv;
            async move {
                let answer = kv
                    .put(
                        b,
                        "first",
                        bytes::Bytes::from_static(b"1"),
                        Expect::Revision(0),
                    )
                    .await;
                (b, answer)
            }
        }))
        .await;
        for (b, answer) in writes {
            assert!(
                matches!(answer, Ok(Ok(_))),
                "round {round}: the first write to {b:?} answered {answer:?}"
            );
        }
    }
}

/// A listing's pass runs on the stream leader. The broker places a pass's
/// consumer on any replica, and a follower that has not applied an
/// acknowledged write yet delivers the key's previous revision: a
/// fresh-clone CI run listed a record one write behind a replace it had just
/// seen acknowledged (`contract::replace_record`). Every pass the seam sees
/// is checked against the broker's own word on where its consumer is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_pass_runs_on_the_stream_leader() {
    use std::sync::{Arc, Mutex};

    use crewlet_coord::kv::{Expect, Kv};
    use crewlet_coord::nats::{PASS_STARTED, PLACEMENT_ATTEMPTS, PassHook, PassSeen};
    use futures::FutureExt;

    let f = contract::fixtures::Real::cluster().await;
    let kv = f.nats(1);
    let b = crewlet_coord::Bucket::Mailboxes;
    kv.put(b, "cas.k", bytes::Bytes::from_static(b"1"), Expect::Any)
        .await
        .unwrap()
        .unwrap();
    let js = async_nats::jetstream::new(contract::fixtures::connect(&f.urls()[2]).await);
    let stream = kv.stream_name(b).unwrap();
    type Row = (PassSeen, Option<String>, Option<String>);
    let rows: Arc<Mutex<Vec<Row>>> = Arc::default();
    let hook: PassHook = {
        let rows = rows.clone();
        Arc::new(move |seen: PassSeen| {
            let (js, stream, rows) = (js.clone(), stream.clone(), rows.clone());
            async move {
                let mut s = js.get_stream(&stream).await.unwrap();
                let leader = s
                    .info()
                    .await
                    .unwrap()
                    .cluster
                    .clone()
                    .and_then(|c| c.leader);
                let on = s
                    .consumer_info(&seen.consumer)
                    .await
                    .unwrap()
                    .cluster
                    .and_then(|c| c.leader);
                rows.lock().unwrap().push((seen, on, leader));
            }
            .boxed()
        })
    };
    for _ in 0..24 {
        let listed = PASS_STARTED
            .scope(hook.clone(), kv.list(b, None))
            .await
            .expect("a listing on a healthy cluster answers");
        assert_eq!(listed.len(), 1);
    }
    let rows = rows.lock().unwrap();
    assert_eq!(rows.len(), 24, "the seam saw every pass");
    for (seen, on, leader) in rows.iter() {
        assert!(
            on.is_some() && leader.is_some(),
            "{seen:?} on {on:?}, leader {leader:?}"
        );
        assert_eq!(
            seen.on_leader,
            on == leader,
            "{seen:?} on {on:?}, leader {leader:?}"
        );
        if !seen.on_leader {
            assert_eq!(
                seen.placements, PLACEMENT_ATTEMPTS,
                "{seen:?} left on a follower early"
            );
        }
    }
}
