use super::*;

fn map(headers: &[(&'static str, String)]) -> async_nats::HeaderMap {
    let mut h = async_nats::HeaderMap::new();
    for (name, value) in headers {
        h.insert(*name, value.as_str());
    }
    h
}

#[test]
fn what_a_pass_on_carries_reads_back_from_its_headers() {
    let carried = Carried {
        failures: 3,
        not_before_ms: Some(1_700_000_000_123),
        owed: Some(vec!["ada".into(), "linus".into()]),
    };
    assert_eq!(Carried::of(Some(&map(&carried.headers()))), carried);
    let fresh = Carried::of(None);
    assert_eq!(
        fresh,
        Carried {
            failures: 0,
            not_before_ms: None,
            owed: None
        }
    );
}

#[test]
fn every_pass_on_of_one_delivery_has_an_id_of_its_own() {
    let at = |failures, owed: Option<&[&str]>| Carried {
        failures,
        not_before_ms: Some(1),
        owed: owed.map(|o| o.iter().map(|h| (*h).to_owned()).collect()),
    };
    let ids: std::collections::HashSet<String> = [
        at(1, None),
        at(2, None),
        at(1, Some(&["ada", "linus"])),
        at(1, Some(&["linus"])),
        at(0, Some(&["linus"])),
    ]
    .iter()
    .map(|c| c.msg_id("github:42"))
    .collect();
    assert_eq!(ids.len(), 5, "{ids:?}");
    assert!(!ids.contains("github:42"), "the edge's own id");
}

#[test]
fn a_delivery_waits_out_its_delay_but_not_a_clock_disagreement() {
    let due_at = |at| Carried {
        failures: 1,
        not_before_ms: Some(at),
        owed: None,
    };
    assert_eq!(due_at(10_000).wait(10_000), None);
    assert_eq!(due_at(10_000).wait(12_000), None);
    assert_eq!(due_at(10_000).wait(9_500), Some(Duration::from_millis(500)));
    let beyond = RETRY_DELAY.as_millis() as i64 + 1;
    assert_eq!(due_at(10_000 + beyond).wait(10_000), None);
}
