//! The forms a secret could be found in, and one pass that finds any of them.
//!
//! A value can leak as itself, as hex (either case), or as base64 (standard
//! or URL-safe, padded or not). Base64 of a larger blob that holds the value
//! encodes it differently at each of the three byte alignments, so for each
//! alignment only the characters that depend on the value's bytes alone
//! (the stable core) are searched. A hit names the value and the form,
//! never the value itself.

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE};

/// One searchable form of one named value.
struct Form {
    secret: &'static str,
    form: String,
}

/// Every form of every value, searched in one pass.
pub struct Needles {
    forms: Vec<Form>,
    finder: AhoCorasick,
}

/// Where a form was found in one haystack.
#[derive(Debug)]
pub struct Hit {
    /// The value's name (e.g. `KEY_ONE`), never the value.
    pub secret: &'static str,
    pub form: String,
    pub offset: usize,
}

impl Needles {
    /// The forms of each `(name, value)`.
    pub fn of(values: &[(&'static str, String)]) -> Needles {
        let mut forms = Vec::new();
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        for (name, value) in values {
            for (form, bytes) in forms_of(value.as_bytes()) {
                forms.push(Form { secret: name, form });
                patterns.push(bytes);
            }
        }
        let finder = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .expect("the needles build a searcher");
        Needles { forms, finder }
    }

    /// The first form found in `haystack`, if any.
    pub fn find(&self, haystack: &[u8]) -> Option<Hit> {
        self.finder.find(haystack).map(|m| {
            let f = &self.forms[m.pattern().as_usize()];
            Hit {
                secret: f.secret,
                form: f.form.clone(),
                offset: m.start(),
            }
        })
    }
}

fn forms_of(value: &[u8]) -> Vec<(String, Vec<u8>)> {
    let hex: String = value.iter().map(|b| format!("{b:02x}")).collect();
    let mut out = vec![
        ("raw".to_owned(), value.to_vec()),
        ("hex".to_owned(), hex.clone().into_bytes()),
        ("HEX".to_owned(), hex.to_ascii_uppercase().into_bytes()),
    ];
    for (alphabet, engine) in [("base64", &STANDARD), ("base64url", &URL_SAFE)] {
        let padded = engine.encode(value);
        out.push((format!("{alphabet} padded"), padded.clone().into_bytes()));
        let bare = padded.trim_end_matches('=');
        if bare.len() != padded.len() {
            out.push((format!("{alphabet} unpadded"), bare.as_bytes().to_vec()));
        }
        for shift in 0..3 {
            out.push((
                format!("{alphabet} core at offset {shift}"),
                stable_core(engine, value, shift),
            ));
        }
    }
    out
}

/// The base64 characters of `value` placed `shift` bytes into a larger
/// blob that do not depend on the blob's other bytes: whole 3-byte groups
/// made of `value`'s bytes only.
fn stable_core(engine: &base64::engine::GeneralPurpose, value: &[u8], shift: usize) -> Vec<u8> {
    let mut shifted = vec![0u8; shift];
    shifted.extend_from_slice(value);
    let encoded = engine.encode(&shifted);
    let skip = if shift == 0 { 0 } else { 4 };
    encoded.as_bytes()[skip..shifted.len() / 3 * 4].to_vec()
}

#[test]
fn a_value_inside_a_larger_base64_blob_is_found_at_every_alignment() {
    let value = "nosecret-probe-0123456789abcdefXYZ".to_owned();
    let needles = Needles::of(&[("PROBE", value.clone())]);
    for prefix in ["", "a", "ab", "abc"] {
        let blob = format!("user:{prefix}{value}:tail");
        for engine in [&STANDARD, &URL_SAFE] {
            let hit = needles.find(engine.encode(&blob).as_bytes());
            assert!(hit.is_some(), "not found behind {prefix:?}");
        }
    }
    assert!(needles.find(b"nosecret-probe-0123456789abcdefXY").is_none());
}
