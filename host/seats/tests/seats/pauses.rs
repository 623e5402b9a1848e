//! Seat pauses against the in-memory coordination twin: a pause and a
//! resume reach every node's mirror, a seat the company lacks is named,
//! and a store that does not answer changes nothing and says so.

use std::time::{Duration, Instant};

use crewlet_company::{Active, ActiveCompany, Company};
use crewlet_coord::{Coord, CoordOptions, Owner};
use crewlet_seats::{PauseError, PauseMirror, SeatPauses};

const EXAMPLE: &str = include_str!("../../../../examples/company.toml");

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what} within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_pause_reaches_the_mirror_and_a_resume_lifts_it() {
    let (faulty, coord) =
        Coord::breakable_memory(CoordOptions::new(Owner::incarnation("pauses-test")));
    let company = Company::parse(EXAMPLE).expect("the example parses");
    let seat = company
        .seats
        .values()
        .next()
        .expect("a seat")
        .handle
        .to_string();
    let active = ActiveCompany::new(Some(Active::local(company)));
    let pauses = SeatPauses::new("n1".into(), coord.pauses(), active);
    let (mirror, seen) = PauseMirror::start(coord.pauses());
    until("the first listing", || seen.borrow().is_some()).await;
    assert!(seen.borrow().as_ref().unwrap().is_empty());

    let paused = pauses
        .pause(&format!("@{seat}"), "test", Some("maintenance".into()))
        .await
        .expect("paused");
    assert_eq!(paused["seat"], seat.as_str());
    assert_eq!(paused["record"]["reason"], "maintenance");
    until("the mirror holds the pause", || {
        seen.borrow().as_ref().is_some_and(|p| p.contains(&seat))
    })
    .await;

    let resumed = pauses.resume(&seat, "test").await.expect("resumed");
    assert_eq!(resumed["was_paused"], true);
    until("the mirror drops the pause", || {
        seen.borrow().as_ref().is_some_and(|p| !p.contains(&seat))
    })
    .await;
    let again = pauses.resume(&seat, "test").await.expect("answered");
    assert_eq!(again["was_paused"], false, "not paused is said as such");

    let err = pauses
        .pause("nobody", "test", None)
        .await
        .expect_err("no seat");
    assert!(
        matches!(err, PauseError::NoSeat(ref h) if h == "nobody"),
        "{err}"
    );

    faulty.break_store();
    let err = pauses
        .pause(&seat, "test", None)
        .await
        .expect_err("unknown");
    assert!(matches!(err, PauseError::Unavailable { .. }), "{err}");
    assert!(
        seen.borrow().as_ref().is_some_and(|p| !p.contains(&seat)),
        "the mirror keeps its last word while the store is out"
    );
    mirror.stop().await;
}

#[tokio::test]
async fn without_a_company_a_pause_says_so() {
    let (_f, coord) = Coord::breakable_memory(CoordOptions::new(Owner::incarnation("pauses-test")));
    let pauses = SeatPauses::new("n1".into(), coord.pauses(), ActiveCompany::new(None));
    let err = pauses
        .pause("ada", "test", None)
        .await
        .expect_err("no company");
    assert!(matches!(err, PauseError::NoCompany), "{err}");
}
