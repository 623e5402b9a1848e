//! HMAC-SHA256, the host's one implementation.
//!
//! The webhook world's `crypto` import is computed here (natively, with the
//! CPU's SHA instructions where it has them, several times faster than SHA
//! in a guest), and so is every signature the host itself makes — test and
//! sample deliveries signed the way the senders sign them — so a signature
//! the host makes is exactly one a plugin's verification accepts.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// HMAC-SHA256 of `data` under `key` (RFC 2104; any key length).
pub fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn matches_the_rfc_4231_vectors() {
        // Test case 2: a short key.
        assert_eq!(
            hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block, hashed first.
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }
}
