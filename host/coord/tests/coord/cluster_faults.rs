//! Cluster-only fault cases: a member cut off from its peers.

use std::time::Duration;

use crewlet_coord::{
    Coord, CoordOptions, NatsKv, Owner, ResourceName, bucket::Bucket, bucket::Retentions,
};
use crewlet_testkit::Cluster;

fn opts(namespace: &str) -> CoordOptions {
    let mut o = CoordOptions::new(Owner::incarnation("faults"));
    o.namespace = namespace.to_owned();
    o.replicas = 3;
    o.lease_ttl = Duration::from_secs(30);
    o.request_timeout = Duration::from_secs(2);
    o
}

async fn open(url: &str, o: &CoordOptions) -> (Coord, std::sync::Arc<NatsKv>, async_nats::Client) {
    let client = async_nats::connect(url).await.expect("connect");
    let ret = Retentions {
        lease_ttl: o.lease_ttl,
        status: o.status_age,
        rate: o.rate_age,
    };
    let kv = std::sync::Arc::new(
        NatsKv::open(
            client.clone(),
            &o.namespace,
            &Bucket::ALL,
            &ret,
            o.replicas,
            o.request_timeout,
        )
        .await
        .expect("open buckets"),
    );
    let dynkv: std::sync::Arc<dyn crewlet_coord::Kv> = kv.clone();
    (
        Coord::with_backends(dynkv.clone(), dynkv, o.clone()),
        kv,
        client,
    )
}

async fn stream_leader(client: &async_nats::Client, stream: &str) -> Option<String> {
    let js = async_nats::jetstream::new(client.clone());
    let info = js.get_stream(stream).await.ok()?.get_info().await.ok()?;
    info.cluster.and_then(|c| c.leader)
}

/// Reads through a member that leads nothing, with that member cut off from
/// its peers, answer unavailable — never "not held" — while the majority
/// goes on answering; after healing, the member answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_member_answers_unavailable_never_not_held() {
    let cluster = Cluster::start();
    let o = opts("part");
    let (c0, kv0, client0) = open(&cluster.url(0), &o).await;
    let seat = ResourceName::seat("partitioned").unwrap();
    let held = c0
        .acquire(&seat, &Owner::incarnation("a"), None)
        .await
        .unwrap()
        .yes()
        .unwrap();
    let cut = 2;
    let cut_name = cluster.server_name(cut).to_owned();
    let keep = cluster.server_name(0).to_owned();
    // Move every bucket's stream leader (and the meta leader) off the member.
    let js0 = async_nats::jetstream::new(client0.clone());
    for b in Bucket::ALL {
        let stream = kv0.stream_name(b).unwrap();
        for _ in 0..50 {
            match stream_leader(&client0, &stream).await {
                Some(l) if l != cut_name => break,
                _ => {
                    let req = serde_json::json!({"placement": {"preferred": keep}});
                    let _: Result<serde_json::Value, _> = js0
                        .request(format!("STREAM.LEADER.STEPDOWN.{stream}"), &req)
                        .await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        assert_ne!(
            stream_leader(&client0, &stream).await.as_deref(),
            Some(cut_name.as_str()),
            "{stream}"
        );
    }
    if crewlet_testkit::cluster::meta_leader(cluster.member(cut).spec().monitor_port).as_deref()
        == Some(&cut_name)
    {
        let req = serde_json::json!({"placement": {"preferred": keep}});
        let _: Result<serde_json::Value, _> = js0.request("META.LEADER.STEPDOWN", &req).await;
        cluster.wait_ready(Duration::from_secs(30));
    }
    let (c_cut, _, _client_cut) = open(&cluster.url(cut), &o).await;
    assert_eq!(
        c_cut.get(&seat).await.unwrap().yes().unwrap().epoch,
        held.epoch,
        "reads through the member before the cut"
    );

    cluster.isolate(cut);
    let (get, renew, list, claim, epoch) = tokio::join!(
        c_cut.get(&seat),
        c_cut.renew(&held),
        c_cut.list_live("seat"),
        c_cut.claim("delivery-x", "me", Duration::from_secs(60)),
        c_cut.epoch(&seat),
    );
    assert!(
        matches!(get, Err(ref e) if e.is_unavailable()),
        "get through the cut member: {get:?}"
    );
    assert!(
        matches!(renew, Err(ref e) if e.is_unavailable()),
        "renew: {renew:?}"
    );
    assert!(
        matches!(list, Err(ref e) if e.is_unavailable()),
        "list: {list:?}"
    );
    assert!(
        matches!(claim, Err(ref e) if e.is_unavailable()),
        "claim: {claim:?}"
    );
    assert!(
        matches!(epoch, Err(ref e) if e.is_unavailable()),
        "epoch: {epoch:?}"
    );
    // The majority still answers, and still says held.
    let still = c0
        .get(&seat)
        .await
        .unwrap()
        .yes()
        .expect("the majority still holds the seat");
    assert_eq!(still.epoch, held.epoch);

    cluster.heal(cut);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match c_cut.get(&seat).await {
            Ok(a) => {
                assert_eq!(a.yes().expect("held after healing").epoch, held.epoch);
                break;
            }
            Err(e) => {
                assert!(e.is_unavailable(), "{e}");
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the member did not rejoin: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// With two of three members down, the survivor's streams have no leader:
/// a listing through it is refused (its index is not trusted during an
/// election), never answered short; after the members return it answers
/// in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_without_a_stream_leader_is_refused_not_short() {
    let mut cluster = Cluster::start();
    let o = opts("noleader");
    let (c0, _, _client0) = open(&cluster.url(0), &o).await;
    for i in 0..5 {
        c0.put_record(
            Bucket::Positions,
            "pos",
            &format!("n{i}"),
            &serde_json::json!(i),
        )
        .await
        .unwrap();
    }
    assert_eq!(
        c0.list_records(Bucket::Positions, "pos")
            .await
            .unwrap()
            .len(),
        5
    );
    cluster.stop(1);
    cluster.stop(2);
    // The survivor notices it lost its peers within the broker's
    // lost-quorum interval; until then it may still answer as leader.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    let refusal = loop {
        match c0.list_records(Bucket::Positions, "pos").await {
            Ok(all) => {
                assert_eq!(all.len(), 5, "a listing answered short: {all:?}");
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the survivor never lost its leader"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => break e,
        }
    };
    assert!(refusal.is_unavailable(), "{refusal}");
    eprintln!("listing without a leader answered: {refusal}");
    // Restarted on this thread, which outlives the check (a member dies
    // with the thread that spawned it).
    cluster.restart_all(&[1, 2]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match c0.list_records(Bucket::Positions, "pos").await {
            Ok(all) => {
                assert_eq!(
                    all.len(),
                    5,
                    "a listing answered short after the election: {all:?}"
                );
                break;
            }
            Err(e) => {
                assert!(e.is_unavailable(), "{e}");
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no leader came back: {e}"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}
