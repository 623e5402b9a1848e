//! HMAC and constant-time comparison, the only crypto the sources need.

#[cfg(not(all(feature = "component", target_family = "wasm")))]
use hmac::{Hmac, Mac};
#[cfg(not(all(feature = "component", target_family = "wasm")))]
use sha2::Sha256;
use subtle::ConstantTimeEq;

#[cfg(not(all(feature = "component", target_family = "wasm")))]
type HmacSha256 = Hmac<Sha256>;

/// HMAC-SHA256 of the concatenation of `parts` under `key`. In a
/// component the host computes it, through the SDK
/// (`crewlet_plugin_sdk::webhook::hmac_sha256`); natively (this crate's
/// tests, the host's benchmark), where there is no host to import from,
/// the `hmac` crate stands in for it.
pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    #[cfg(all(feature = "component", target_family = "wasm"))]
    {
        crewlet_plugin_sdk::webhook::hmac_sha256(key, parts)
    }
    #[cfg(not(all(feature = "component", target_family = "wasm")))]
    {
        let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts keys of any length");
        for part in parts {
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }
}

/// Whether `expected` is the HMAC-SHA256 of `parts` under `key`, compared
/// in constant time.
pub fn hmac_sha256_verify(key: &[u8], parts: &[&[u8]], expected: &[u8]) -> bool {
    constant_time_eq(&hmac_sha256(key, parts), expected)
}

/// Constant-time equality of two byte strings. The lengths are compared
/// first, which reveals only the length of the secret.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// Lower- or upper-case hex to bytes; `None` on odd length or a non-hex
/// character.
pub fn decode_hex(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 2);
    for pair in bytes.chunks_exact(2) {
        out.push((nibble(pair[0])? << 4) | nibble(pair[1])?);
    }
    Some(out)
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_rejects() {
        assert_eq!(decode_hex("00ff1A"), Some(vec![0, 255, 26]));
        assert_eq!(decode_hex("abc"), None);
        assert_eq!(decode_hex("zz"), None);
    }

    #[test]
    fn constant_time_eq_checks_length_and_content() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
