//! A seat's long memory in a real store file: the change sequence only
//! ever increases, recall ranks by cosine distance in SQLite and never
//! compares vectors of another model or dimension, and rows replayed from
//! the stream keep the newer copy.

use crewlet_store::{Applied, DiaryNote, Episode, Onboarded, Profile, Store, Vector};

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_in(dir.path()).unwrap();
    (dir, store)
}

fn v(model: &str, values: &[f32]) -> Vector {
    Vector {
        model: model.into(),
        values: values.to_vec(),
    }
}

fn note(id: &str, text: &str, at: i64, vector: Option<Vector>) -> DiaryNote {
    DiaryNote {
        seat: "ada".into(),
        note_id: id.into(),
        text: text.into(),
        turn_id: Some("t1".into()),
        created_ms: at,
        updated_ms: at,
        vector,
        change_seq: 0,
    }
}

fn episode(turn: &str, summary: &str, at: i64, vector: Option<Vector>) -> Episode {
    Episode {
        seat: "ada".into(),
        turn_id: turn.into(),
        conversation: Some("C1#1".into()),
        trigger: "a question".into(),
        asked_by: vec!["U1".into()],
        tools: vec!["chat__post_message".into()],
        reply: Some("an answer".into()),
        outcome: "delivered".into(),
        input_tokens: 10,
        output_tokens: 5,
        summary: summary.into(),
        ended_ms: at,
        updated_ms: at,
        vector,
        change_seq: 0,
    }
}

fn texts(recalled: &[crewlet_store::Recalled<DiaryNote>]) -> Vec<&str> {
    recalled.iter().map(|r| r.row.text.as_str()).collect()
}

#[test]
fn every_row_is_stamped_from_one_sequence_that_never_repeats() {
    let (dir, s) = store();
    assert_eq!(s.memory_change_sequence().unwrap(), 0);
    let a = s.put_note(&note("n1", "one", 1, None)).unwrap();
    let b = s.put_episode(&episode("t1", "e", 2, None)).unwrap();
    let c = s
        .put_profile(&Profile {
            seat: "ada".into(),
            counterparty: "U1".into(),
            known: "asks about builds".into(),
            turns: 1,
            first_ms: 3,
            last_ms: 3,
            updated_ms: 3,
            change_seq: 0,
        })
        .unwrap();
    assert_eq!((a.change_seq, b.change_seq, c.change_seq), (1, 2, 3));
    // Rewriting the newest row takes a new number, never its old one.
    let again = s.put_note(&note("n1", "one, again", 4, None)).unwrap();
    assert_eq!(again.change_seq, 4);
    // A replayed row this node has newer is kept and takes no number.
    let stale = s.apply_notes(&[note("n1", "older", 0, None)]).unwrap();
    assert_eq!(stale, [Applied::KeptLocal]);
    assert_eq!(s.note("ada", "n1").unwrap().unwrap().text, "one, again");
    assert_eq!(s.memory_change_sequence().unwrap(), 4);
    // Reopened, the counter goes on from where it was.
    drop(s);
    let s = Store::open_in(dir.path()).unwrap();
    assert_eq!(
        s.put_note(&note("n2", "two", 5, None)).unwrap().change_seq,
        5
    );
}

#[test]
fn notes_are_ranked_by_cosine_distance_and_other_models_fall_back_to_recency() {
    let (_dir, s) = store();
    let m = "scripted/bag";
    s.put_note(&note(
        "near",
        "the build is on main",
        1,
        Some(v(m, &[1.0, 0.1, 0.0])),
    ))
    .unwrap();
    s.put_note(&note(
        "nearer",
        "main builds green",
        2,
        Some(v(m, &[1.0, 0.0, 0.0])),
    ))
    .unwrap();
    s.put_note(&note(
        "far",
        "lunch at noon",
        3,
        Some(v(m, &[0.0, 0.0, 1.0])),
    ))
    .unwrap();
    s.put_note(&note(
        "other-model",
        "from another model",
        4,
        Some(v("openai/x", &[1.0, 0.0, 0.0])),
    ))
    .unwrap();
    s.put_note(&note(
        "other-dim",
        "another dimension",
        5,
        Some(v(m, &[1.0, 0.0])),
    ))
    .unwrap();
    s.put_note(&note("plain", "never embedded", 6, None))
        .unwrap();
    let q = v(m, &[1.0, 0.0, 0.0]);
    let got = s.recall_notes("ada", Some(&q), 0.5, 10).unwrap();
    assert_eq!(
        texts(&got),
        [
            "main builds green",
            "the build is on main",
            // Not compared: by recency, newest first.
            "never embedded",
            "another dimension",
            "from another model",
        ],
        "the far note is past the distance; the rest never compared"
    );
    assert!(got[0].distance.unwrap() < 1e-6 && got[1].distance.unwrap() > 0.0);
    assert!(got[2..].iter().all(|r| r.distance.is_none()));
    // Without a query vector: the newest notes.
    let recent = s.recall_notes("ada", None, 0.5, 2).unwrap();
    assert_eq!(texts(&recent), ["never embedded", "another dimension"]);
    // Another seat's notes are never recalled.
    assert!(s.recall_notes("bob", Some(&q), 2.0, 10).unwrap().is_empty());
}

#[test]
fn similar_episodes_are_only_those_embedded_like_the_query() {
    let (_dir, s) = store();
    let m = "scripted/bag";
    s.put_episode(&episode(
        "t1",
        "fixed the deploy",
        1,
        Some(v(m, &[1.0, 0.0])),
    ))
    .unwrap();
    s.put_episode(&episode("t2", "ordered lunch", 2, Some(v(m, &[0.0, 1.0]))))
        .unwrap();
    s.put_episode(&episode("t3", "no vector", 3, None)).unwrap();
    let stored = s.episode("ada", "t1").unwrap().unwrap();
    assert_eq!(stored.tools, ["chat__post_message"]);
    assert_eq!(stored.vector, Some(v(m, &[1.0, 0.0])));
    let got = s
        .recall_episodes("ada", &v(m, &[0.9, 0.1]), 0.3, 5)
        .unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].row.summary, "fixed the deploy");
    assert!(
        s.recall_episodes("ada", &v("other/m", &[1.0, 0.0]), 2.0, 5)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_vector_of_the_wrong_length_is_refused_by_the_schema() {
    let (_dir, s) = store();
    // A stored dimension must match the blob: the store never keeps a
    // vector it would misread.
    let n = note("n1", "x", 1, Some(v("m", &[])));
    assert!(s.put_note(&n).is_err(), "an empty vector has no direction");
    assert_eq!(s.note("ada", "n1").unwrap(), None);
}

#[test]
fn a_seat_is_onboarded_once_and_the_first_marker_stays() {
    let (_dir, s) = store();
    assert_eq!(s.onboarded("ada").unwrap(), None);
    let first = Onboarded {
        seat: "ada".into(),
        turn_id: "t1".into(),
        onboarded_ms: 10,
        updated_ms: 10,
        change_seq: 0,
    };
    assert_eq!(s.mark_onboarded(&first).unwrap().turn_id, "t1");
    let later = Onboarded {
        turn_id: "t2".into(),
        onboarded_ms: 20,
        updated_ms: 20,
        ..first.clone()
    };
    assert_eq!(s.mark_onboarded(&later).unwrap().turn_id, "t1");
    assert_eq!(s.apply_markers(&[later]).unwrap(), [Applied::KeptLocal]);
}
