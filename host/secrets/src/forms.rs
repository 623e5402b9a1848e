//! The text forms a secret value travels in, for scrubbers to remove.
//!
//! Rule: a scrubber removes a value as itself, as hex (either case) and as
//! base64 (standard and URL-safe, padded and not). Why: whatever repeats a
//! secret (a child's stderr, a plugin's error) often encodes it on the way
//! (a token dumped in hex, a credential in base64), and the raw value alone
//! would let those forms through into logs, events and status rows.

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
    if let Ok(text) = std::str::from_utf8(value) {
        out.push(text.to_owned());
    }
    out.sort_by_key(|f| std::cmp::Reverse(f.len()));
    out.dedup();
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
}
