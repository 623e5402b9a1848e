//! Skills, ageing and promotion against a real SQLite file.

use super::*;
use crate::skills::{Learned, SkillRow};
use crate::{Applied, Store};

const DAY: i64 = 24 * 3600 * 1000;

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_in(dir.path()).unwrap();
    (dir, store)
}

fn learn(store: &Store, seat: &str, name: &str, procedure: &str, at: i64) -> SkillRow {
    store
        .learn_skill(
            &Learned {
                seat,
                name,
                origin: Origin::Induced,
                promoted_from: &[],
                procedure,
                episodes: &["t1".into(), "t2".into(), "t3".into()],
                model: "openai/reflect",
            },
            at,
        )
        .unwrap()
        .0
}

fn change_seqs(store: &Store) -> Vec<i64> {
    store.column(
        "SELECT change_seq FROM synthesized_skills
         UNION ALL SELECT change_seq FROM synthesized_skill_versions ORDER BY 1",
    )
}

#[test]
fn a_skill_learned_again_is_a_new_version_and_every_version_stays() {
    let (_dir, store) = store();
    let first = learn(
        &store,
        "ada",
        "Deploy check",
        "1. read the run 2. say green",
        10,
    );
    assert_eq!(
        (first.skill_id.as_str(), first.version),
        ("deploy-check", 1)
    );
    let again = learn(
        &store,
        "ada",
        "deploy  CHECK!",
        "1. read the run 2. link it",
        20,
    );
    assert_eq!(
        (again.skill_id.as_str(), again.version),
        ("deploy-check", 2)
    );
    let all = store.skills("ada").unwrap();
    assert_eq!(all.len(), 1);
    let procedures: Vec<&str> = all[0]
        .versions
        .iter()
        .map(|v| v.procedure.as_str())
        .collect();
    assert_eq!(
        procedures,
        ["1. read the run 2. say green", "1. read the run 2. link it"]
    );
    assert_eq!(all[0].versions[1].episodes, ["t1", "t2", "t3"]);
    let active = store.active_skills("ada", 5).unwrap();
    assert_eq!(
        active[0].1, "1. read the run 2. link it",
        "the block reads the current version"
    );
    assert!(
        store.skills("bob").unwrap().is_empty(),
        "skills are per seat"
    );
    // Every write took a new number of the one memory sequence, never reused.
    let seqs = change_seqs(&store);
    let mut unique = seqs.clone();
    unique.dedup();
    assert_eq!(unique.len(), seqs.len(), "{seqs:?}");

    let refused = store.learn_skill(
        &Learned {
            seat: "ada",
            name: "  ?!  ",
            origin: Origin::Induced,
            promoted_from: &[],
            procedure: "x",
            episodes: &[],
            model: "m",
        },
        30,
    );
    assert!(
        matches!(refused, Err(crate::SkillRefused::NoName(_))),
        "{refused:?}"
    );
}

#[test]
fn a_replayed_row_is_written_unless_this_nodes_is_newer() {
    let (_dir, store) = store();
    let mine = learn(&store, "ada", "Deploy check", "steps", 100);
    let older = SkillRow {
        uses: 9,
        updated_ms: 50,
        ..mine.clone()
    };
    assert_eq!(store.apply_skills(&[older]).unwrap(), [Applied::KeptLocal]);
    let newer = SkillRow {
        uses: 9,
        updated_ms: 150,
        ..mine.clone()
    };
    assert_eq!(
        store.apply_skills(std::slice::from_ref(&newer)).unwrap(),
        [Applied::Written]
    );
    assert_eq!(store.skills("ada").unwrap()[0].skill, newer);
    let version = store.skills("ada").unwrap()[0].versions[0].clone();
    let moved = crate::SkillVersionRow {
        seat: "bob".into(),
        ..version
    };
    assert_eq!(
        store.apply_skill_versions(&[moved]).unwrap(),
        [Applied::Written]
    );
}

/// The duty's new version (node W) and a turn's use of the old one (node
/// H) cross on the stream: either arrival order leaves the same row, with
/// the duty's version and the turn's use both kept; a retirement beats a
/// use of the same version, and a use after it is still counted.
#[test]
fn a_skill_rows_two_writers_apply_the_same_in_either_order() {
    let (_w_dir, w) = store();
    let (_h_dir, h) = store();
    let v1 = learn(&w, "ada", "Deploy check", "steps", 100);
    h.apply_skills(std::slice::from_ref(&v1)).unwrap();
    let v2 = learn(&w, "ada", "Deploy check", "better steps", 200);
    let used = h
        .use_skills("ada", std::slice::from_ref(&v1.skill_id), 300)
        .unwrap();
    assert_eq!((v2.version, used[0].version), (2, 1));
    let mut ends = Vec::new();
    for order in [[v2.clone(), used[0].clone()], [used[0].clone(), v2.clone()]] {
        let (_dir, s) = store();
        s.apply_skills(std::slice::from_ref(&v1)).unwrap();
        for row in order {
            s.apply_skills(&[row]).unwrap();
        }
        ends.push(s.skills("ada").unwrap()[0].skill.clone());
    }
    assert_eq!(ends[0], ends[1], "the result depends on arrival order");
    let end = &ends[0];
    assert_eq!((end.version, end.uses, end.last_used_ms), (2, 1, Some(300)));
    assert_eq!(end.updated_ms, 300);

    // A retirement of v2 against a later use of v2: retired, use counted.
    let retired = SkillRow {
        state: "retired".into(),
        retired_ms: Some(400),
        updated_ms: 400,
        ..end.clone()
    };
    let used_again = SkillRow {
        uses: 2,
        last_used_ms: Some(500),
        updated_ms: 500,
        ..end.clone()
    };
    let mut ends = Vec::new();
    for order in [
        [retired.clone(), used_again.clone()],
        [used_again.clone(), retired.clone()],
    ] {
        let (_dir, s) = store();
        s.apply_skills(std::slice::from_ref(end)).unwrap();
        for row in order {
            s.apply_skills(&[row]).unwrap();
        }
        ends.push(s.skills("ada").unwrap()[0].skill.clone());
    }
    assert_eq!(ends[0], ends[1], "the result depends on arrival order");
    assert_eq!(
        (ends[0].state.as_str(), ends[0].uses, ends[0].retired_ms),
        ("retired", 2, Some(400))
    );
    // A row older in both groups changes nothing.
    let (_dir, s) = store();
    s.apply_skills(std::slice::from_ref(&ends[0])).unwrap();
    assert_eq!(s.apply_skills(&[v1]).unwrap(), [Applied::KeptLocal]);
}

#[test]
fn an_unused_skill_decays_and_retires_and_a_used_one_stays() {
    let (_dir, store) = store();
    let half_life = 7 * DAY;
    learn(&store, "ada", "Deploy check", "steps", 0);
    learn(&store, "ada", "Triage", "steps", 0);
    // 20 days on, "Triage" was carried by a prompt; "Deploy check" never.
    store
        .use_skills("ada", &["triage".into()], 20 * DAY)
        .unwrap();
    let now = 25 * DAY;
    let skills = store.skills("ada").unwrap();
    let of = |id: &str| {
        skills
            .iter()
            .find(|h| h.skill.skill_id == id)
            .unwrap()
            .skill
            .clone()
    };
    assert!(strength(&of("deploy-check"), now, half_life) < RETIRE_BELOW);
    assert!(strength(&of("triage"), now, half_life) > 0.5);

    let retired = store.age_skills("ada", now, half_life).unwrap();
    assert_eq!(retired.len(), 1);
    assert_eq!(
        (retired[0].skill_id.as_str(), retired[0].state.as_str()),
        ("deploy-check", "retired")
    );
    let active: Vec<String> = store
        .active_skills("ada", 10)
        .unwrap()
        .into_iter()
        .map(|(s, _)| s.skill_id)
        .collect();
    assert_eq!(active, ["triage"]);
    assert_eq!(
        store.skills("ada").unwrap().len(),
        2,
        "a retired skill stays readable"
    );
    assert!(
        store.age_skills("ada", now, half_life).unwrap().is_empty(),
        "retired once"
    );
    // Learned again, it is active again at its next version.
    let back = learn(&store, "ada", "Deploy check", "new steps", now);
    assert_eq!(
        (back.state.as_str(), back.version, back.retired_ms),
        ("active", 2, None)
    );
}

#[test]
fn a_skill_two_seats_induced_is_offered_to_the_rest_of_the_role() {
    let (_dir, store) = store();
    let role: Vec<String> = ["ada", "bob", "cy", "dee"].map(String::from).to_vec();
    learn(&store, "ada", "Deploy check", "ada's steps", 10);
    assert!(
        store.promotions(&role, 2).unwrap().is_empty(),
        "one seat is not several"
    );
    learn(&store, "bob", "deploy check", "bob's steps", 20);
    learn(&store, "dee", "Deploy check", "dee's own", 5);
    learn(&store, "ada", "Only mine", "x", 10);
    let offered = store.promotions(&role, 2).unwrap();
    assert_eq!(offered.len(), 1, "{offered:?}");
    let p = &offered[0];
    assert_eq!(p.skill_id, "deploy-check");
    assert_eq!(p.procedure, "bob's steps", "the newest inducer's procedure");
    assert_eq!(p.from, ["dee", "ada", "bob"]);
    assert_eq!(p.to, ["cy"]);
    // A promoted copy does not count as a seat that induced it.
    store.learn_skill(&p.for_seat("cy"), 30).unwrap();
    assert!(store.promotions(&role, 2).unwrap().is_empty());
    let cy = &store.skills("cy").unwrap()[0].skill;
    assert_eq!((cy.origin, cy.promoted_from.len()), (Origin::Promoted, 3));
    // A seat outside the role is never offered it.
    assert!(store.skills("eve").unwrap().is_empty());
}

#[test]
fn a_reflection_reads_the_newest_delivered_episodes_after_its_watermark() {
    let (_dir, store) = store();
    {
        let conn = store.conn();
        for (i, outcome) in [
            "delivered",
            "delivered",
            "not_delivered",
            "delivered",
            "delivered",
        ]
        .iter()
        .enumerate()
        {
            conn.execute(
                "INSERT INTO episodes (seat, turn_id, trigger, outcome, summary, ended_ms, updated_ms, change_seq)
                 VALUES ('ada', ?1, 'slack mention', ?2, ?3, ?4, ?4, ?5)",
                rusqlite::params![format!("t{i}"), outcome, format!("did {i}"), i as i64 * 10, 100 + i as i64],
            )
            .unwrap();
        }
    }
    let read = store.successful_episodes("ada", 0, 2).unwrap();
    let ids: Vec<&str> = read.iter().map(|e| e.turn_id.as_str()).collect();
    assert_eq!(ids, ["t3", "t4"], "the newest, oldest first");
    let after: Vec<String> = store
        .successful_episodes("ada", 10, 10)
        .unwrap()
        .into_iter()
        .map(|e| e.turn_id)
        .collect();
    assert_eq!(
        after,
        ["t3", "t4"],
        "t0 and t1 are at or before the watermark, t2 failed"
    );
    assert_eq!(store.last_induced_ms("ada").unwrap(), None);
    learn(&store, "ada", "Deploy check", "steps", 77);
    assert_eq!(store.last_induced_ms("ada").unwrap(), Some(77));
}

fn episode(turn: &str, ended_ms: i64) -> crate::Episode {
    crate::Episode {
        seat: "ada".into(),
        turn_id: turn.into(),
        conversation: Some("C1#1".into()),
        trigger: format!("asked in {turn}"),
        asked_by: vec!["U1".into()],
        tools: vec!["chat__post_message".into()],
        reply: Some("done".into()),
        outcome: "delivered".into(),
        input_tokens: 10,
        output_tokens: 1,
        summary: format!("Asked: {turn}\nDid: chat__post_message"),
        ended_ms,
        updated_ms: ended_ms,
        vector: None,
        change_seq: 0,
    }
}

fn turn_ids(store: &Store) -> Vec<String> {
    store.column("SELECT turn_id FROM episodes WHERE seat = 'ada' ORDER BY turn_id")
}

#[test]
fn old_episodes_fold_into_one_digest_once_and_recall_stays_bounded() {
    let (_dir, store) = store();
    for i in 1..=5 {
        store
            .put_episode(&episode(&format!("t{i}"), i * 10))
            .unwrap();
    }
    let digest = store
        .compact_episodes("ada", 2, 1000)
        .unwrap()
        .expect("a digest");
    assert_eq!(turn_ids(&store), ["digest", "t4", "t5"]);
    assert_eq!(
        (digest.outcome.as_str(), digest.ended_ms),
        ("compacted", 30)
    );
    assert_eq!((digest.input_tokens, digest.output_tokens), (30, 3));
    assert_eq!(
        digest.summary,
        "Earlier turns, folded (newest first):\n- Asked: t3\n- Asked: t2\n- Asked: t1"
    );
    let ids: Vec<String> = store
        .successful_episodes("ada", 0, 10)
        .unwrap()
        .into_iter()
        .map(|e| e.turn_id)
        .collect();
    assert_eq!(ids, ["t4", "t5"], "a digest is not a turn to reflect on");

    // A folded row replayed from the stream (deletes do not travel) is
    // dropped again, not folded twice.
    store.apply_episodes(&[episode("t2", 20)]).unwrap();
    assert_eq!(store.compact_episodes("ada", 2, 2000).unwrap(), None);
    assert_eq!(turn_ids(&store), ["digest", "t4", "t5"]);
    assert_eq!(
        store.episode("ada", "digest").unwrap().unwrap().summary,
        digest.summary
    );

    // A newer turn pushes t4 out: it joins the digest, newest first.
    store.put_episode(&episode("t6", 60)).unwrap();
    let again = store
        .compact_episodes("ada", 2, 3000)
        .unwrap()
        .expect("a new digest");
    assert_eq!(turn_ids(&store), ["digest", "t5", "t6"]);
    assert!(
        again
            .summary
            .starts_with("Earlier turns, folded (newest first):\n- Asked: t4\n- Asked: t3"),
        "{}",
        again.summary
    );
    assert_eq!((again.ended_ms, again.input_tokens), (40, 40));
    assert_eq!(
        store.compact_episodes("ada", 2, 4000).unwrap(),
        None,
        "nothing past the newest two"
    );
}
