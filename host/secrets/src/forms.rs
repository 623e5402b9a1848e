//! The text forms a secret value travels in, for scrubbers to remove.
//!
//! Rule: a scrubber removes a value as itself, as hex (either case) and as
//! base64 (standard and URL-safe, padded and not). Why: whatever repeats a
//! secret (a child's stderr, a plugin's error) often encodes it on the way
//! (a token dumped in hex, a credential in base64), and the raw value alone
//! would let those forms through into logs, events and status rows.
//! A value inside a larger base64 blob (`user:token` in Basic auth) is
//! encoded at one of three byte alignments; the characters that depend on
//! the value alone at each alignment (its *core*) are a form too, so the
//! blob is scrubbed of all but the few edge characters it shares with its
//! neighbours.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};

/// Every form of `value`, longest first, so a replacement of one form is
/// never half-done by a shorter one.
pub fn forms(value: &[u8]) -> Vec<String> {
    let hex: String = value.iter().map(|b| format!("{b:02x}")).collect();
    let mut out = vec![hex.to_ascii_uppercase(), hex];
    for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
        out.push(engine.encode(value));
    }
    for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
        out.extend(cores(engine, value));
    }
    if let Ok(text) = std::str::from_utf8(value) {
        out.push(text.to_owned());
    }
    out.sort_by_key(|f| std::cmp::Reverse(f.len()));
    out.dedup();
    out
}

/// The shortest core worth scrubbing: shorter ones would match unrelated
/// text.
const MIN_CORE: usize = 8;

/// The base64 characters that depend on `value` alone, at each of the
/// three byte alignments it can sit at inside a larger blob.
fn cores(engine: &impl base64::Engine, value: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    for offset in 0..3usize {
        let mut shifted = vec![0u8; offset];
        shifted.extend_from_slice(value);
        let text = engine.encode(&shifted);
        // Characters before `skip` hold bits of the bytes before the value;
        // a last character that is not whole holds bits of the bytes after.
        let skip = (offset * 8).div_ceil(6);
        let whole = (shifted.len() * 8) / 6;
        if whole > skip && whole - skip >= MIN_CORE {
            out.push(text[skip..whole].to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_hex_and_both_base64_alphabets_are_forms() {
        let f = forms(b"\xfb\xffkey?");
        for form in ["fbff6b65793f", "FBFF6B65793F", "+/9rZXk/", "-_9rZXk_"] {
            assert!(f.iter().any(|x| x == form), "{form} not in {f:?}");
        }
        assert!(forms(b"tok").contains(&"tok".to_owned()));
        assert!(forms(b"tok").contains(&"dG9r".to_owned()));
    }

    #[test]
    fn a_value_inside_a_base64_blob_leaves_a_core_at_every_alignment() {
        let secret = b"s3cr3t-t0ken-abcdef";
        for prefix in [&b"u:"[..], b"us:", b"use:"] {
            let mut blob = prefix.to_vec();
            blob.extend_from_slice(secret);
            blob.extend_from_slice(b"@trailer");
            let encoded = STANDARD.encode(&blob);
            assert!(
                forms(secret).iter().any(|f| encoded.contains(f.as_str())),
                "no form of the secret found in {encoded} (prefix {prefix:?})"
            );
        }
    }
}
