//! Contract cases for follows: one key per thread, written by
//! compare-and-set from any member, and an unknown that is never "nobody".

use crewlet_coord::{Answer, ChatThread, CoordError};

use super::fixtures::Fixture;

fn thread() -> ChatThread {
    ChatThread::new(
        "slack",
        "C0FOLLOW",
        format!(
            "1700000000.{}",
            &uuid::Uuid::new_v4().simple().to_string()[..6]
        ),
    )
}

/// Seats follow a thread from any member, each entry its own; leaving
/// takes one seat out, the last one removes the key, and a later post
/// follows again over the removal.
pub async fn follows_one_key_per_thread<F: Fixture>(f: &F) {
    let (a, b) = (f.coord(0).follows(), f.coord(1).follows());
    let t = thread();
    assert!(a.followers(&t).await.unwrap().is_empty());
    a.follow(&t, "ada").await.unwrap();
    b.follow(&t, "bob").await.unwrap();
    // A second post renews ada's entry, not a second one.
    a.follow(&t, "ada").await.unwrap();
    assert_eq!(b.followers(&t).await.unwrap(), ["ada", "bob"]);
    // Another thread of the same channel is another key.
    let other = ChatThread::new(&t.backend, &t.channel, format!("{}9", t.thread));
    assert!(a.followers(&other).await.unwrap().is_empty());

    assert_eq!(b.leave(&t, "ada").await.unwrap(), Answer::Yes(()));
    assert_eq!(a.leave(&t, "ada").await.unwrap(), Answer::No(()));
    assert_eq!(a.followers(&t).await.unwrap(), ["bob"]);
    assert_eq!(a.leave(&t, "bob").await.unwrap(), Answer::Yes(()));
    assert!(b.followers(&t).await.unwrap().is_empty());
    b.follow(&t, "ada").await.unwrap();
    assert_eq!(a.followers(&t).await.unwrap(), ["ada"]);

    // Seats posting in one thread at once, through every member: all land.
    let crowd = thread();
    let handles: Vec<String> = (0..8).map(|i| format!("seat{i}")).collect();
    let writes = handles.iter().enumerate().map(|(i, h)| {
        let follows = f.coord(i).follows();
        let crowd = crowd.clone();
        async move { follows.follow(&crowd, h).await }
    });
    for w in futures::future::join_all(writes).await {
        w.expect("a contended follow lands");
    }
    assert_eq!(a.followers(&crowd).await.unwrap(), handles);

    // A thread no key can name is refused, not followed.
    let nameless = ChatThread::new("slack", "C1", "");
    assert!(matches!(
        a.follow(&nameless, "ada").await,
        Err(CoordError::InvalidName { .. })
    ));
    assert!(matches!(
        a.followers(&nameless).await,
        Err(CoordError::InvalidName { .. })
    ));
}

/// An unreachable store answers every follows call unknown — never an
/// empty list of followers, never "did not follow".
pub async fn follows_unknown_is_not_nobody<F: Fixture>(f: &F) {
    let c = f.coord(0).follows();
    let t = thread();
    c.follow(&t, "ada").await.unwrap();
    f.break_store().await;
    let read = c.followers(&t).await;
    assert!(
        matches!(&read, Err(e) if e.is_unavailable()),
        "followers: {read:?}"
    );
    let left = c.leave(&t, "ada").await;
    assert!(
        matches!(&left, Err(e) if e.is_unavailable()),
        "leave: {left:?}"
    );
    let followed = c.follow(&t, "bob").await;
    assert!(
        matches!(&followed, Err(e) if e.is_unavailable()),
        "follow: {followed:?}"
    );
    f.heal_store().await;
    assert_eq!(c.followers(&t).await.unwrap(), ["ada"]);
}
