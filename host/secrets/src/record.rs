//! What the secrets bucket holds per secret ([`Record`]: a sealed envelope
//! and when it was set), the names it accepts, and what a listing shows.
//! The node's store keeps the very same record for a secret set while the
//! node was stopped.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::keyring::{Envelope, Keyring};

/// Record class of a secret in the secrets bucket (`secret.NAME`).
pub const SECRET_CLASS: &str = "secret";
/// Largest secret value accepted.
pub const MAX_SECRET_BYTES: usize = 64 * 1024;

/// Why a secrets operation was refused or could not be done.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error(
        "{0:?} is not a secret name: use letters, digits and `_`, not starting with a digit, at most 128 characters"
    )]
    BadName(String),
    #[error("the value of {name} is {len} bytes; a secret holds at most {MAX_SECRET_BYTES} bytes")]
    TooLarge { name: String, len: usize },
    #[error("the secrets bucket cannot be reached ({0}); nothing changed — retry in a few seconds")]
    Unavailable(String),
    #[error(
        "the secrets bucket holds an unreadable record for {name} ({why}); set the secret again"
    )]
    Corrupt { name: String, why: String },
    #[error(
        "this node has no keyring open, so it cannot seal {0}; start the node with its keyring"
    )]
    NoKeyring(String),
    #[error(transparent)]
    Keyring(#[from] crate::keyring::KeyringError),
}

/// Checks a secret's name: the rule `SecretRef::name` applies to the names a
/// company document uses, so every name a document can reference can be set.
pub fn check_name(name: &str) -> Result<(), SecretsError> {
    crewlet_company::SecretRef::name(name)
        .map(|_| ())
        .map_err(|_| SecretsError::BadName(name.to_owned()))
}

/// What the bucket holds per secret: a sealed value and when it was set.
/// The node's store keeps the same record for a secret set while it was
/// stopped (see [`Secrets::put_record`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub envelope: Envelope,
    pub updated_ms: u64,
}

impl Record {
    /// Seals `value` as `name` under `keyring`'s current key.
    pub fn seal(keyring: &Keyring, name: &str, value: &str) -> Result<Record, SecretsError> {
        check_value(name, value)?;
        Ok(Record {
            envelope: keyring.seal(name, value),
            updated_ms: crewlet_os::now_ms() as u64,
        })
    }

    pub fn to_bytes(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).expect("a record serialises"))
    }

    /// Reads a record back; `name` only labels the error.
    pub fn from_bytes(name: &str, bytes: &[u8]) -> Result<Record, SecretsError> {
        serde_json::from_slice(bytes).map_err(|err| SecretsError::Corrupt {
            name: name.to_owned(),
            // serde's message can quote the input: say where, not what.
            why: format!(
                "not a sealed secret record (line {}, column {})",
                err.line(),
                err.column()
            ),
        })
    }
}

pub(crate) fn check_value(name: &str, value: &str) -> Result<(), SecretsError> {
    check_name(name)?;
    if value.len() > MAX_SECRET_BYTES {
        return Err(SecretsError::TooLarge {
            name: name.to_owned(),
            len: value.len(),
        });
    }
    Ok(())
}

/// A name, when it was last set and the key that sealed it: what a listing
/// shows (never the value). `problem` says why this node cannot open it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listed {
    pub name: String,
    pub updated_ms: u64,
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}
