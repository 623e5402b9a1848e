//! Contract cases for plain records.

use crewlet_coord::{Answer, Bucket, CoordError};
use serde_json::json;

use super::fixtures::Fixture;

/// `replace_record` is a compare-and-set: it lands only at the revision a
/// read answered, a moved or removed record is No, and an unknown stays an
/// error (a lost ack is not "it moved").
pub async fn replace_record<F: Fixture>(f: &F) {
    let (c, other) = (f.coord(0), f.coord(1));
    let b = Bucket::Mailboxes;
    let class = "cas";
    let id = uuid::Uuid::new_v4().simple().to_string();
    assert_eq!(
        c.replace_record(b, class, &id, &json!({"v": 0}), 1)
            .await
            .unwrap(),
        Answer::No(()),
        "a record never written was replaced"
    );
    assert!(matches!(
        c.replace_record(b, class, &id, &json!({"v": 0}), 0).await,
        Err(CoordError::Invalid(_))
    ));
    assert!(
        c.get_record(b, class, &id).await.unwrap().is_no(),
        "a refused replace wrote"
    );

    let r1 = c
        .create_record(b, class, &id, &json!({"v": 1}))
        .await
        .unwrap()
        .yes()
        .unwrap();
    let r2 = other
        .replace_record(b, class, &id, &json!({"v": 2}), r1)
        .await
        .unwrap()
        .yes()
        .expect("a replace at the revision read lands");
    assert!(r2 > r1, "{r2} after {r1}");
    assert_eq!(
        c.get_record(b, class, &id).await.unwrap(),
        Answer::Yes((json!({"v": 2}), r2))
    );
    assert_eq!(
        c.replace_record(b, class, &id, &json!({"v": 3}), r1)
            .await
            .unwrap(),
        Answer::No(()),
        "a stale replace landed"
    );
    assert_eq!(
        other
            .list_records_with_revisions(b, class)
            .await
            .unwrap()
            .get(&id),
        Some(&(json!({"v": 2}), r2))
    );

    // Two replacers at the same revision: exactly one lands.
    let (vx, vy) = (json!({"v": "x"}), json!({"v": "y"}));
    let (x, y) = futures::join!(
        c.replace_record(b, class, &id, &vx, r2),
        other.replace_record(b, class, &id, &vy, r2),
    );
    let (x, y) = (x.unwrap(), y.unwrap());
    assert!(x.is_yes() != y.is_yes(), "{x:?} and {y:?}");
    let (winner, r3) = if x.is_yes() {
        (vx, x.yes().unwrap())
    } else {
        (vy, y.yes().unwrap())
    };
    assert_eq!(
        other.get_record(b, class, &id).await.unwrap(),
        Answer::Yes((winner, r3))
    );

    // Removed: a replace at its last live revision is No and revives nothing.
    c.remove_record(b, class, &id).await.unwrap().yes().unwrap();
    assert_eq!(
        c.replace_record(b, class, &id, &json!({"v": 4}), r3)
            .await
            .unwrap(),
        Answer::No(())
    );
    assert!(c.get_record(b, class, &id).await.unwrap().is_no());

    // Unknown is never No: a broken store, then a write whose ack is lost.
    let r5 = c
        .create_record(b, class, &id, &json!({"v": 5}))
        .await
        .unwrap()
        .yes()
        .unwrap();
    f.break_store().await;
    let broken = c.replace_record(b, class, &id, &json!({"v": 6}), r5).await;
    assert!(
        matches!(broken, Err(ref e) if e.is_unavailable()),
        "{broken:?}"
    );
    f.heal_store().await;
    f.lose_acks();
    let lost = c.replace_record(b, class, &id, &json!({"v": 6}), r5).await;
    assert!(matches!(lost, Err(ref e) if e.is_unavailable()), "{lost:?}");
    f.heal_store().await;
    let (value, r6) = other
        .get_record(b, class, &id)
        .await
        .unwrap()
        .yes()
        .unwrap();
    assert_eq!(
        value,
        json!({"v": 6}),
        "the write whose ack was lost landed"
    );
    assert!(r6 > r5);
}

/// A claim record of the shape its class is read as.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Fire {
    epoch: crewlet_coord::FenceEpoch,
    state: String,
}

/// Typed claims: the first claim wins and a later one is answered with
/// the record there and its revision; a record that does not decode is an
/// error naming the bucket and key — never a default.
pub async fn typed_claims<F: Fixture>(f: &F) {
    let (c, other) = (f.coord(0), f.coord(1));
    let class = "typed";
    let fires = c.claims::<Fire>(Bucket::Fires, class);
    let id = uuid::Uuid::new_v4().simple().to_string();
    let mine = Fire {
        epoch: crewlet_coord::FenceEpoch(4),
        state: "claimed".into(),
    };
    let rev = fires
        .claim(&id, &mine)
        .await
        .unwrap()
        .yes()
        .expect("the first claim wins");
    let theirs = Fire {
        epoch: crewlet_coord::FenceEpoch(5),
        state: "claimed".into(),
    };
    assert_eq!(
        other
            .claims::<Fire>(Bucket::Fires, class)
            .claim(&id, &theirs)
            .await
            .unwrap(),
        Answer::No((mine.clone(), rev)),
        "a later claim is answered with the record there"
    );
    let published = Fire {
        state: "published".into(),
        ..mine.clone()
    };
    let rev2 = fires
        .replace(&id, &published, rev)
        .await
        .unwrap()
        .yes()
        .unwrap();
    assert_eq!(
        fires.get(&id).await.unwrap(),
        Answer::Yes((published, rev2))
    );
    // Written by another shape (a build that spelled the epoch as text).
    let bad = uuid::Uuid::new_v4().simple().to_string();
    c.put_record(
        Bucket::Fires,
        class,
        &bad,
        &json!({"epoch": "four", "state": "claimed"}),
    )
    .await
    .unwrap();
    for answer in [
        fires.get(&bad).await.map(|_| ()),
        fires.claim(&bad, &theirs).await.map(|_| ()),
    ] {
        match answer {
            Err(CoordError::Corrupt { bucket, key, .. }) => {
                assert_eq!(bucket, "fires");
                assert!(key.starts_with("typed.") && key.ends_with(&bad), "{key}");
            }
            other => panic!("an undecodable record was answered {other:?}"),
        }
    }
}
