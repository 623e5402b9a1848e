//! HMAC-SHA256, for signing test and benchmark deliveries the way GitHub
//! does (`X-Hub-Signature-256: sha256=HEX`). Verification happens in the
//! plugins, never here.

use sha2::{Digest, Sha256};

/// HMAC-SHA256 of `body` under `key` (RFC 2104).
pub fn hmac_sha256(key: &[u8], body: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(body);
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// The `X-Hub-Signature-256` value GitHub sends for `body`.
pub fn github_signature(secret: &[u8], body: &[u8]) -> String {
    let mac = hmac_sha256(secret, body);
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_rfc_4231_vector() {
        // RFC 4231 test case 2.
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
