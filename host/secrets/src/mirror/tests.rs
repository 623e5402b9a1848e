use bytes::Bytes;

use super::*;
use crewlet_coord::bucket::Retentions;
use crewlet_coord::{Faulty, MemoryKv, SystemClock};
use std::sync::atomic::{AtomicBool, Ordering};

/// A keyring file in its own directory; opening it again gives another
/// node of the same fleet the same keys.
pub(crate) struct Ring(tempfile::TempDir);

impl Ring {
    pub(crate) fn new() -> Ring {
        let dir = tempfile::tempdir().unwrap();
        Keyring::open_or_create(&dir.path().join("keyring")).unwrap();
        Ring(dir)
    }

    pub(crate) fn open(&self) -> Keyring {
        Keyring::open(&self.0.path().join("keyring")).unwrap()
    }
}

pub(crate) fn kv() -> (Arc<Faulty>, Arc<dyn Kv>) {
    let ret = Retentions {
        lease_ttl: Duration::from_secs(45),
        status: Duration::from_secs(60),
        rate: Duration::from_secs(60),
    };
    let mem: Arc<dyn Kv> = Arc::new(MemoryKv::new(Arc::new(SystemClock), &ret));
    let faulty = Faulty::new(mem);
    (faulty.clone(), faulty)
}

async fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_secret_set_anywhere_reaches_every_snapshot_and_removal_too() {
    let (_f, kv) = kv();
    let ring = Ring::new();
    let a = Secrets::start(kv.clone(), ring.open()).await;
    let b = Secrets::start(kv.clone(), ring.open()).await;
    a.set("CREWLET_TEST_ONE", "s3cret").await.unwrap();
    assert_eq!(a.get("CREWLET_TEST_ONE").found().as_deref(), Some("s3cret"));
    eventually("b sees the set", || {
        b.get("CREWLET_TEST_ONE").found().as_deref() == Some("s3cret")
    })
    .await;
    let resolve = b.resolver();
    assert_eq!(
        resolve.lookup("CREWLET_TEST_ONE").found().as_deref(),
        Some("s3cret")
    );
    let listed = b.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "CREWLET_TEST_ONE");
    assert!(
        !format!("{listed:?}").contains("s3cret"),
        "a listing never holds values"
    );

    assert!(b.remove("CREWLET_TEST_ONE").await.unwrap());
    assert!(!b.remove("CREWLET_TEST_ONE").await.unwrap(), "already gone");
    eventually("a sees the removal", || {
        a.get("CREWLET_TEST_ONE") == Lookup::Unset
    })
    .await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn the_bucket_wins_over_the_environment_which_is_the_fallback() {
    let (_f, kv) = kv();
    // SAFETY: this test alone uses this variable name.
    unsafe { std::env::set_var("CREWLET_TEST_FALLBACK", "from-env") };
    let s = Secrets::start(kv, Ring::new().open()).await;
    assert_eq!(
        s.get("CREWLET_TEST_FALLBACK").found().as_deref(),
        Some("from-env")
    );
    s.set("CREWLET_TEST_FALLBACK", "from-bucket").await.unwrap();
    assert_eq!(
        s.get("CREWLET_TEST_FALLBACK").found().as_deref(),
        Some("from-bucket")
    );
    s.remove("CREWLET_TEST_FALLBACK").await.unwrap();
    assert_eq!(
        s.get("CREWLET_TEST_FALLBACK").found().as_deref(),
        Some("from-env")
    );
    assert_eq!(s.get("CREWLET_TEST_NOWHERE"), Lookup::Unset);
    s.stop().await;
}

#[tokio::test]
async fn bad_names_and_oversized_values_are_refused_and_change_nothing() {
    let (_f, kv) = kv();
    let s = Secrets::start(kv, Ring::new().open()).await;
    for bad in ["", "1ABC", "A-B", "A.B", "A B", &"A".repeat(129)] {
        assert!(
            matches!(s.set(bad, "v").await, Err(SecretsError::BadName(_))),
            "{bad:?}"
        );
    }
    let big = "x".repeat(MAX_SECRET_BYTES + 1);
    let err = s.set("BIG", &big).await.unwrap_err();
    assert!(matches!(err, SecretsError::TooLarge { .. }), "{err}");
    assert!(
        !err.to_string().contains("xxxx"),
        "the value is never quoted"
    );
    assert!(s.list().await.unwrap().is_empty());
    s.stop().await;
}

#[tokio::test]
async fn an_unreachable_bucket_keeps_the_snapshot_and_is_unavailable_for_writes() {
    let (f, kv) = kv();
    let s = Secrets::start(kv, Ring::new().open()).await;
    s.set("KEPT", "v1").await.unwrap();
    f.break_store();
    assert!(matches!(
        s.set("KEPT", "v2").await,
        Err(SecretsError::Unavailable(_))
    ));
    assert!(matches!(s.list().await, Err(SecretsError::Unavailable(_))));
    assert_eq!(
        s.get("KEPT").found().as_deref(),
        Some("v1"),
        "the snapshot stays"
    );
    f.heal();
    s.set("KEPT", "v3").await.unwrap();
    assert_eq!(s.get("KEPT").found().as_deref(), Some("v3"));
    s.stop().await;
}

#[tokio::test]
async fn a_value_without_its_key_or_with_a_corrupt_envelope_is_unavailable_and_the_rest_served() {
    let (_f, kv) = kv();
    let fleet = Ring::new();
    let a = Secrets::start(kv.clone(), fleet.open()).await;
    a.set("SHARED", "shared-value").await.unwrap();
    // Another node whose keyring is not the fleet's.
    let stranger = Secrets::start(kv.clone(), Ring::new().open()).await;
    eventually("the stranger sees SHARED", || {
        stranger.get("SHARED") != Lookup::Unset
    })
    .await;
    match stranger.get("SHARED") {
        Lookup::Unavailable(why) => {
            assert!(why.contains("SHARED") && why.contains("keyring"), "{why}");
            assert!(!why.contains("shared-value"), "{why}");
        }
        other => panic!("a value without its key is unavailable, not {other:?}"),
    }
    // A corrupt envelope: the record parses, the ciphertext is altered.
    let (mut rec, _) = a.record("SHARED").await.unwrap().unwrap();
    rec.envelope.sealed.replace_range(0..4, "AAAA");
    a.put_record("BENT", &rec, Expect::Any).await.unwrap();
    kv.put(
        Bucket::Secrets,
        &key_of("JUNK"),
        Bytes::from_static(b"{not json"),
        Expect::Any,
    )
    .await
    .unwrap()
    .unwrap();
    a.set("FINE", "fine-value").await.unwrap();
    let b = Secrets::start(kv.clone(), fleet.open()).await;
    for name in ["BENT", "JUNK"] {
        match b.get(name) {
            Lookup::Unavailable(why) => assert!(why.contains(name), "{why}"),
            other => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(b.get("FINE").found().as_deref(), Some("fine-value"));
    assert_eq!(b.get("SHARED").found().as_deref(), Some("shared-value"));
    let listed = b.list().await.unwrap();
    let problems: Vec<_> = listed
        .iter()
        .filter(|l| l.problem.is_some())
        .map(|l| l.name.as_str())
        .collect();
    assert_eq!(problems, ["BENT", "JUNK"]);
    assert!(!format!("{listed:?}").contains("value"), "{listed:?}");
    for s in [a, b, stranger] {
        s.stop().await;
    }
}

#[test]
fn an_older_change_never_overwrites_a_newer_one() {
    let snap = Snapshot::default();
    snap.apply("A".into(), Some(Err("new".into())), 5);
    snap.apply("A".into(), Some(Err("old".into())), 4);
    assert_eq!(snap.get("A"), Some(Some(Err("new".into()))));
    snap.apply("A".into(), None, 6);
    snap.apply("A".into(), Some(Err("new".into())), 5);
    assert_eq!(snap.get("A"), Some(None), "removed, and kept removed");
}

/// An opener over `kv` that fails until `opens` is set, counting its calls.
fn gated(kv: Arc<dyn Kv>) -> (Opener, Arc<AtomicBool>, Arc<std::sync::atomic::AtomicUsize>) {
    let opens = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let opener: Opener = Arc::new({
        let (opens, calls) = (opens.clone(), calls.clone());
        move || {
            calls.fetch_add(1, Ordering::SeqCst);
            let kv = kv.clone();
            let open = opens.load(Ordering::SeqCst);
            Box::pin(async move {
                if open {
                    Ok(kv)
                } else {
                    Err("the broker refused to open the bucket".to_owned())
                }
            })
        }
    });
    (opener, opens, calls)
}

#[tokio::test]
async fn a_bucket_not_opened_at_start_is_unknown_never_the_environment_and_opened_again() {
    let (_f, kv) = kv();
    let ring = Ring::new();
    // The fleet rotated the key in the bucket; this node's environment
    // still holds the old one.
    let fleet = Secrets::start(kv.clone(), ring.open()).await;
    fleet.set("CREWLET_TEST_ROTATED", "new-key").await.unwrap();
    // SAFETY: this test alone uses these variable names.
    unsafe {
        std::env::set_var("CREWLET_TEST_ROTATED", "stale-key");
        std::env::set_var("CREWLET_TEST_ENV_ONLY", "from-env");
    }
    let (opener, opens, calls) = gated(kv.clone());
    let s = Secrets::with_opener(opener, ring.open(), Duration::from_millis(50)).await;
    for name in [
        "CREWLET_TEST_ROTATED",
        "CREWLET_TEST_ENV_ONLY",
        "CREWLET_TEST_NONE",
    ] {
        match s.get(name) {
            Lookup::Unknown(why) => assert!(why.contains(name) && why.contains("retry"), "{why}"),
            other => panic!("{name} before the bucket answered: {other:?}"),
        }
        assert_eq!(s.source(name), Source::Unknown);
    }
    assert!(!s.is_listed());
    assert!(
        matches!(
            s.set("CREWLET_TEST_X", "v").await,
            Err(SecretsError::Unavailable(_))
        ),
        "a write with no bucket open is refused, not lost silently"
    );
    eventually("the opener is tried again with a backoff", || {
        calls.load(Ordering::SeqCst) >= 3
    })
    .await;
    opens.store(true, Ordering::SeqCst);
    let listed = tokio::time::timeout(Duration::from_secs(20), s.until_listed()).await;
    assert_eq!(listed.ok(), Some(true), "listed once the bucket opens");
    assert_eq!(
        s.get("CREWLET_TEST_ROTATED").found().as_deref(),
        Some("new-key"),
        "the bucket wins over a stale environment value"
    );
    assert_eq!(s.source("CREWLET_TEST_ROTATED"), Source::Bucket);
    assert_eq!(
        s.get("CREWLET_TEST_ENV_ONLY").found().as_deref(),
        Some("from-env")
    );
    assert_eq!(s.source("CREWLET_TEST_ENV_ONLY"), Source::Environment);
    assert_eq!(s.get("CREWLET_TEST_NONE"), Lookup::Unset);
    assert_eq!(s.source("CREWLET_TEST_NONE"), Source::Unset);
    s.set("CREWLET_TEST_X", "v").await.unwrap();
    s.stop().await;
    fleet.stop().await;
}

#[tokio::test]
async fn a_watch_that_cannot_be_opened_opens_the_bucket_again_before_watching_again() {
    let (f, kv) = kv();
    let (opener, opens, calls) = gated(kv.clone());
    opens.store(true, Ordering::SeqCst);
    // The bucket opens, but its watch does not (as when the bucket was
    // deleted after it was opened).
    f.break_store();
    let s = Secrets::with_opener(opener, Ring::new().open(), Duration::from_millis(50)).await;
    eventually("the bucket is opened again after each failed watch", || {
        calls.load(Ordering::SeqCst) >= 3
    })
    .await;
    assert!(matches!(s.get("ANY"), Lookup::Unknown(_)));
    f.heal();
    let listed = tokio::time::timeout(Duration::from_secs(20), s.until_listed()).await;
    assert_eq!(listed.ok(), Some(true), "listed once the watch opens");
    assert_eq!(s.get("ANY"), Lookup::Unset);
    s.set("KEPT", "v2").await.unwrap();
    assert_eq!(s.get("KEPT").found().as_deref(), Some("v2"));
    s.stop().await;
}

#[tokio::test]
async fn the_standing_is_unknown_until_listed_and_every_change_moves_the_counter() {
    let (_f, kv) = kv();
    let ring = Ring::new();
    let (opener, opens, _calls) = gated(kv.clone());
    let s = Secrets::with_opener(opener, ring.open(), Duration::from_millis(50)).await;
    let mut changes = s.changes();
    changes.borrow_and_update();
    eventually("the refusal is the standing's reason", || {
        s.standing().error.is_some()
    })
    .await;
    let unknown = s.standing();
    assert_eq!(
        (unknown.state, unknown.source),
        (Knowledge::Unknown, Basis::None)
    );
    assert!(unknown.error.unwrap().contains("refused"));
    assert!(!changes.has_changed().unwrap(), "nothing learned yet");

    opens.store(true, Ordering::SeqCst);
    let moved = tokio::time::timeout(Duration::from_secs(20), changes.changed()).await;
    assert!(
        moved.is_ok_and(|r| r.is_ok()),
        "the listing moves the counter"
    );
    let known = s.standing();
    assert_eq!(
        (known.state, known.source),
        (Knowledge::Known, Basis::Bucket)
    );
    assert_eq!(known.error, None);
    assert!(known.since_ms >= unknown.since_ms);

    // A value another node sets moves it too, once it lands here.
    let fleet = Secrets::start(kv, ring.open()).await;
    changes.borrow_and_update();
    fleet.set("CREWLET_TEST_LATE", "v").await.unwrap();
    let moved = tokio::time::timeout(Duration::from_secs(5), changes.changed()).await;
    assert!(moved.is_ok_and(|r| r.is_ok()), "a set moves the counter");
    assert_eq!(s.get("CREWLET_TEST_LATE").found().as_deref(), Some("v"));
    s.stop().await;
    fleet.stop().await;
}
