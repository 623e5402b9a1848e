//! The contract suite against a 3-node nats-server cluster on loopback,
//! every handle on a different member.
mod contract;

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
