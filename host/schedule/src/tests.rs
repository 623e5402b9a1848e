use super::*;

fn tz(name: &str) -> TimeZone {
    TimeZone::get(name).unwrap()
}

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn take(cron: &str, zone: &str, after: &str, n: usize) -> Vec<String> {
    Cron::parse(cron)
        .unwrap()
        .fires(&tz(zone), at(after))
        .take(n)
        .map(|t| t.to_zoned(tz(zone)).to_string())
        .collect()
}

#[test]
fn five_fields_are_minute_to_weekday() {
    assert_eq!(
        take("0 9 * * mon-fri", "UTC", "2026-12-04T08:00:00Z", 3),
        [
            "2026-12-04T09:00:00+00:00[UTC]",
            "2026-12-07T09:00:00+00:00[UTC]",
            "2026-12-08T09:00:00+00:00[UTC]",
        ]
    );
    assert_eq!(
        take(
            "15 */6 1 jan,JUL *",
            "America/New_York",
            "2026-06-30T12:00:00Z",
            2
        ),
        [
            "2026-07-01T00:15:00-04:00[America/New_York]",
            "2026-07-01T06:15:00-04:00[America/New_York]",
        ]
    );
}

#[test]
fn a_sixth_leading_field_is_seconds() {
    assert_eq!(
        take("*/20 * * * * *", "UTC", "2026-12-01T10:00:00Z", 3),
        [
            "2026-12-01T10:00:20+00:00[UTC]",
            "2026-12-01T10:00:40+00:00[UTC]",
            "2026-12-01T10:01:00+00:00[UTC]",
        ]
    );
    assert_eq!(
        take("30 0 9 * * *", "UTC", "2026-12-01T10:00:00Z", 1),
        ["2026-12-02T09:00:30+00:00[UTC]"]
    );
}

#[test]
fn aliases_are_their_five_field_forms() {
    for (alias, long) in [
        ("@daily", "0 0 * * *"),
        ("@HOURLY", "0 * * * *"),
        ("@weekly", "0 0 * * sun"),
        ("@monthly", "0 0 1 * *"),
        ("@annually", "0 0 1 1 *"),
    ] {
        assert_eq!(
            take(alias, "Europe/Berlin", "2026-12-01T10:00:00Z", 3),
            take(long, "Europe/Berlin", "2026-12-01T10:00:00Z", 3),
            "{alias}"
        );
    }
    assert_eq!(Cron::parse("  @daily ").unwrap().as_str(), "@daily");
}

#[test]
fn a_bad_expression_says_what_is_wrong_and_what_is_accepted() {
    for (bad, reason) in [
        ("", "it is empty"),
        ("* * *", "it has 3 fields"),
        ("0 0 9 * * * 2027", "it has 7 fields"),
        ("61 * * * *", "out of bounds"),
        ("0 9 * * funday", "illegal"),
        ("@reboot", "not an alias"),
    ] {
        let err = Cron::parse(bad).unwrap_err();
        assert!(matches!(err, CronError::Invalid { .. }), "{bad}: {err:?}");
        let text = err.to_string();
        assert!(text.contains(&format!("{:?}", bad.trim())), "{text}");
        assert!(text.contains(reason), "{bad}: {text}");
        assert!(
            text.contains("five fields") && text.contains("@daily"),
            "{text}"
        );
    }
    let err = Cron::parse("0 0 30 2 *").unwrap_err();
    assert_eq!(
        err,
        CronError::NeverFires {
            expression: "0 0 30 2 *".into()
        }
    );
    assert!(err.to_string().contains("never fire"), "{err}");
}

#[test]
fn a_daily_0230_in_berlin_fires_once_on_both_transition_days() {
    let spring = take("30 2 * * *", "Europe/Berlin", "2026-03-27T12:00:00Z", 4);
    assert_eq!(
        spring,
        [
            "2026-03-28T02:30:00+01:00[Europe/Berlin]",
            // 02:30 does not exist on 29 March: the gap shifts it to 03:30.
            "2026-03-29T03:30:00+02:00[Europe/Berlin]",
            "2026-03-30T02:30:00+02:00[Europe/Berlin]",
            "2026-03-31T02:30:00+02:00[Europe/Berlin]",
        ]
    );
    let autumn = take("30 2 * * *", "Europe/Berlin", "2026-10-23T12:00:00Z", 4);
    assert_eq!(
        autumn,
        [
            "2026-10-24T02:30:00+02:00[Europe/Berlin]",
            // 02:30 happens twice on 25 October: the first (CEST) fires.
            "2026-10-25T02:30:00+02:00[Europe/Berlin]",
            "2026-10-26T02:30:00+01:00[Europe/Berlin]",
            "2026-10-27T02:30:00+01:00[Europe/Berlin]",
        ]
    );
}

#[test]
fn a_search_starting_after_the_gap_still_finds_the_shifted_fire() {
    let cron = Cron::parse("30 2 * * *").unwrap();
    let berlin = tz("Europe/Berlin");
    // 03:10 CEST: the shifted 02:30 (03:30 CEST) is still ahead.
    assert_eq!(
        cron.next_after(&berlin, at("2026-03-29T01:10:00Z")),
        Some(at("2026-03-29T01:30:00Z"))
    );
    assert_eq!(
        cron.next_after(&berlin, at("2026-03-29T01:30:00Z")),
        Some(at("2026-03-30T00:30:00Z"))
    );
    // 02:40 CET, the second 02:30 to 02:59: 02:30 already fired (CEST).
    assert_eq!(
        cron.next_after(&berlin, at("2026-10-25T01:40:00Z")),
        Some(at("2026-10-26T01:30:00Z"))
    );
}

/// Consecutive differences, in minutes, of an every-minute schedule.
fn minute_steps(zone: &str, after: &str, until: &str) -> Vec<i64> {
    let fires = Cron::parse("* * * * *")
        .unwrap()
        .between(&tz(zone), at(after), at(until));
    fires
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_mins())
        .collect()
}

#[test]
fn every_minute_across_the_autumn_fold_is_strictly_increasing_and_quiet_for_the_repeat() {
    let steps = minute_steps(
        "Europe/Berlin",
        "2026-10-24T23:00:00Z",
        "2026-10-25T03:00:00Z",
    );
    assert!(steps.iter().all(|s| *s > 0), "strictly increasing");
    // 01:01 to 02:59 CEST, then 03:00 to 04:00 CET: the repeated hour
    // (02:00 to 02:59 CET) already fired as CEST.
    assert_eq!(steps.len() + 1, 119 + 61);
    assert_eq!(steps.iter().filter(|s| **s != 1).collect::<Vec<_>>(), [&61]);
}

#[test]
fn every_minute_across_the_spring_gap_fires_every_instant_minute_once() {
    let steps = minute_steps(
        "Europe/Berlin",
        "2026-03-29T00:00:00Z",
        "2026-03-29T03:00:00Z",
    );
    assert_eq!(steps.len() + 1, 180);
    assert!(steps.iter().all(|s| *s == 1), "{steps:?}");
}

/// The fires of `cron` after `after`, found the slow way: every civil
/// minute from a day before, matched one by one, mapped, kept when later
/// than every fire so far.
fn by_every_minute(cron: &Cron, zone: &TimeZone, after: Timestamp, n: usize) -> Vec<Timestamp> {
    let mut civil = zone
        .to_datetime(after)
        .checked_sub(SignedDuration::from_hours(26))
        .unwrap()
        .with()
        .second(0)
        .subsec_nanosecond(0)
        .build()
        .unwrap();
    let mut last = Timestamp::MIN;
    let mut out = Vec::new();
    while out.len() < n {
        if cron.pattern.is_time_matching(&civil).unwrap() {
            let instant = zone.to_ambiguous_timestamp(civil).compatible().unwrap();
            if instant > last {
                last = instant;
                if instant > after {
                    out.push(instant);
                }
            }
        }
        civil = civil.checked_add(SignedDuration::from_mins(1)).unwrap();
    }
    out
}

#[test]
fn fires_from_any_instant_agree_with_a_minute_by_minute_walk() {
    let transitions = [
        ("Europe/Berlin", "2026-03-29T01:00:00Z"),
        ("Europe/Berlin", "2026-10-25T01:00:00Z"),
        ("America/New_York", "2026-03-08T07:00:00Z"),
        ("America/New_York", "2026-11-01T06:00:00Z"),
        // A half-hour shift.
        ("Australia/Lord_Howe", "2026-04-04T15:00:00Z"),
        ("Australia/Lord_Howe", "2026-10-03T15:30:00Z"),
    ];
    let crons = ["* * * * *", "30 2 * * *", "*/7 1-3 * * *", "45 */2 * * *"];
    for (zone, transition) in transitions {
        let zone = tz(zone);
        for expression in crons {
            let cron = Cron::parse(expression).unwrap();
            let mut after = at(transition) - SignedDuration::from_hours(3);
            while after < at(transition) + SignedDuration::from_hours(3) {
                let fast: Vec<Timestamp> = cron.fires(&zone, after).take(5).collect();
                assert_eq!(
                    fast,
                    by_every_minute(&cron, &zone, after, 5),
                    "{expression} in {zone:?} after {after}"
                );
                after += SignedDuration::from_secs(17 * 60 + 30);
            }
        }
    }
}

#[test]
fn a_zone_without_transitions_maps_the_clock_as_it_is() {
    let zone = TimeZone::fixed(jiff::tz::offset(5));
    let cron = Cron::parse("0 9 * * *").unwrap();
    assert_eq!(
        cron.next_after(&zone, at("2026-12-01T00:00:00Z")),
        Some(at("2026-12-01T04:00:00Z"))
    );
}

#[test]
fn a_cron_serialises_as_written_and_parses_back() {
    let cron = Cron::parse("0 9 * * MON-fri").unwrap();
    let json = serde_json::to_string(&cron).unwrap();
    assert_eq!(json, "\"0 9 * * MON-fri\"");
    assert_eq!(serde_json::from_str::<Cron>(&json).unwrap(), cron);
    assert!(serde_json::from_str::<Cron>("\"nope\"").is_err());
    assert_eq!(cron.to_string(), cron.as_str());
}

#[test]
fn the_planner_fires_by_policy_and_skips_the_rest() {
    let missed: Vec<Timestamp> = (1..=5)
        .map(|h| at("2026-12-01T00:00:00Z") + SignedDuration::from_hours(h))
        .collect();
    let latest = plan(CatchUp::default(), &missed);
    assert_eq!(latest.fire, [missed[4]]);
    assert_eq!(latest.skip, missed[..4]);

    let none = plan(CatchUp::None, &missed);
    assert!(none.fire.is_empty());
    assert_eq!(none.skip, missed);

    let two = plan(CatchUp::All { limit: 2 }, &missed);
    assert_eq!(two.fire, missed[3..]);
    assert_eq!(two.skip, missed[..3]);

    let many = plan(CatchUp::All { limit: 10 }, &missed);
    assert_eq!(many.fire, missed);
    assert!(many.skip.is_empty());

    let shuffled = [missed[2], missed[0], missed[2], missed[1]];
    let p = plan(CatchUp::All { limit: 2 }, &shuffled);
    assert_eq!(p.fire, missed[1..3]);
    assert_eq!(p.skip, [missed[0]]);

    assert_eq!(plan(CatchUp::Latest, &[]), Plan::default());
    assert_eq!(
        serde_json::to_value(CatchUp::All { limit: 3 }).unwrap(),
        serde_json::json!({ "all": { "limit": 3 } })
    );
}
