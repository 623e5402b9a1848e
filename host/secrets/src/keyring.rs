//! The node's keyring (Tier A, on disk) and the envelopes it seals.
//!
//! Rules, and why:
//! - **Values leave the node sealed.** A value is sealed with
//!   XChaCha20-Poly1305 (RustCrypto `chacha20poly1305`) before it is written
//!   to the secrets bucket, so the stream's files, its history and any
//!   client of the broker see ciphertext only. XChaCha's 192-bit nonce is
//!   safe to draw at random on every seal, so nodes sharing one key need no
//!   nonce counter between them; it is constant-time in software (no AES-NI
//!   needed) and the crate is audited and widely used.
//! - **An envelope names its key and is bound to its secret's name.** The key
//!   id travels in the envelope, and the associated data is the name (and the
//!   key id), so a value copied under another name does not open.
//! - **The keyring is the operator's file, 0600 or refused.** Group or other
//!   permission bits mean someone else may have read it: the node refuses to
//!   start rather than trust it. A fleet shares one keyring file the operator
//!   distributes; a node lacking a key treats that secret as unavailable,
//!   never as empty.
//! - **The last key seals; every key opens.** Rotation appends a key; older
//!   keys stay until no envelope names them.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde::{Deserialize, Serialize};

/// Bytes of a key (XChaCha20-Poly1305 takes 256 bits).
const KEY_BYTES: usize = 32;
/// Bytes of a nonce.
const NONCE_BYTES: usize = 24;
/// Envelope format version.
const VERSION: u8 = 1;

/// Why the keyring could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    #[error(
        "the keyring {path} is readable or writable by others (mode {mode:03o}); run `chmod 600 {path}` and start again"
    )]
    LoosePermissions { path: String, mode: u32 },
    #[error("cannot read the keyring {path}: {source}")]
    Unreadable {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the keyring {path} is not a crewlet keyring ({why}); restore it from the copy your fleet shares"
    )]
    Malformed { path: String, why: String },
    #[error("cannot write the keyring {path}: {source}")]
    Unwritable {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the keyring {path} does not exist; start the node once to create it, or copy your fleet's keyring there (mode 600)"
    )]
    Missing { path: String },
}

/// Why an envelope did not open. Never carries the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error(
        "secret {name} is sealed with key {key}, which this node's keyring lacks; copy the fleet's keyring to this node"
    )]
    NoKey { name: String, key: String },
    #[error("secret {name} has a corrupt envelope ({why}); set the secret again")]
    Corrupt { name: String, why: String },
}

/// A sealed value as the bucket holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    pub v: u8,
    /// Id of the key that sealed it.
    pub key: String,
    pub nonce: String,
    pub sealed: String,
}

#[derive(Clone, Serialize, Deserialize)]
struct KeyEntry {
    id: String,
    key: String,
    created_ms: u64,
}

#[derive(Serialize, Deserialize)]
struct KeyringFile {
    #[serde(rename = "key")]
    keys: Vec<KeyEntry>,
}

struct Key {
    id: String,
    cipher: XChaCha20Poly1305,
    entry: KeyEntry,
}

/// The keys this node holds, loaded from one file.
pub struct Keyring {
    path: PathBuf,
    keys: Vec<Key>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("path", &self.path)
            .field("ids", &self.ids())
            .finish()
    }
}

fn aad(name: &str, key: &str) -> Vec<u8> {
    format!("crewlet-secret:v{VERSION}:{key}:{name}").into_bytes()
}

/// Bytes from the operating system's random source.
fn random<const N: usize>() -> [u8; N] {
    <[u8; N] as chacha20poly1305::aead::Generate>::generate()
}

impl Keyring {
    /// Opens the keyring at `path`, creating it with one fresh key (mode
    /// 0600) when it does not exist. Refuses loose permissions.
    pub fn open_or_create(path: &Path) -> Result<Keyring, KeyringError> {
        match Keyring::open(path) {
            Err(KeyringError::Missing { .. }) => {
                let mut ring = Keyring {
                    path: path.to_owned(),
                    keys: Vec::new(),
                };
                ring.add_key()?;
                Ok(ring)
            }
            other => other,
        }
    }

    /// Opens an existing keyring. Refuses loose permissions.
    pub fn open(path: &Path) -> Result<Keyring, KeyringError> {
        let shown = path.display().to_string();
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(KeyringError::Missing { path: shown });
            }
            Err(source) => {
                return Err(KeyringError::Unreadable {
                    path: shown,
                    source,
                });
            }
        };
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyringError::LoosePermissions { path: shown, mode });
        }
        let text = std::fs::read_to_string(path).map_err(|source| KeyringError::Unreadable {
            path: shown.clone(),
            source,
        })?;
        let malformed = |why: String| KeyringError::Malformed {
            path: shown.clone(),
            why,
        };
        // toml's message can quote the file: say where, not what.
        let file: KeyringFile = toml::from_str(&text).map_err(|e| {
            malformed(match e.span() {
                Some(span) => format!("unreadable at byte {}", span.start),
                None => "unreadable".into(),
            })
        })?;
        if file.keys.is_empty() {
            return Err(malformed("it holds no key".into()));
        }
        let mut keys = Vec::new();
        let mut seen = BTreeSet::new();
        for entry in file.keys {
            let bytes = B64
                .decode(&entry.key)
                .ok()
                .filter(|b| b.len() == KEY_BYTES)
                .ok_or_else(|| {
                    malformed(format!(
                        "key {} is not {KEY_BYTES} bytes of base64",
                        entry.id
                    ))
                })?;
            if !seen.insert(entry.id.clone()) {
                return Err(malformed(format!("key id {} appears twice", entry.id)));
            }
            keys.push(Key {
                id: entry.id.clone(),
                cipher: XChaCha20Poly1305::new_from_slice(&bytes).expect("a 32-byte key"),
                entry,
            });
        }
        Ok(Keyring {
            path: path.to_owned(),
            keys,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The id of the key that seals.
    pub fn current(&self) -> &str {
        &self.keys.last().expect("a keyring holds a key").id
    }

    /// Every key id, oldest first.
    pub fn ids(&self) -> Vec<String> {
        self.keys.iter().map(|k| k.id.clone()).collect()
    }

    /// Seals `value` as the secret `name` under the current key.
    pub fn seal(&self, name: &str, value: &str) -> Envelope {
        let key = self.keys.last().expect("a keyring holds a key");
        let nonce: [u8; NONCE_BYTES] = random();
        let sealed = key
            .cipher
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: value.as_bytes(),
                    aad: &aad(name, &key.id),
                },
            )
            .expect("sealing a value under 64 KiB cannot fail");
        Envelope {
            v: VERSION,
            key: key.id.clone(),
            nonce: B64.encode(nonce),
            sealed: B64.encode(sealed),
        }
    }

    /// Opens the envelope of the secret `name`.
    pub fn open_envelope(&self, name: &str, env: &Envelope) -> Result<String, OpenError> {
        let corrupt = |why: &str| OpenError::Corrupt {
            name: name.to_owned(),
            why: why.to_owned(),
        };
        if env.v != VERSION {
            return Err(corrupt("unknown envelope version"));
        }
        let key = self
            .keys
            .iter()
            .find(|k| k.id == env.key)
            .ok_or_else(|| OpenError::NoKey {
                name: name.to_owned(),
                key: env.key.clone(),
            })?;
        let nonce: [u8; NONCE_BYTES] = B64
            .decode(&env.nonce)
            .ok()
            .and_then(|n| n.try_into().ok())
            .ok_or_else(|| corrupt("the nonce is not 24 bytes of base64"))?;
        let sealed = B64
            .decode(&env.sealed)
            .map_err(|_| corrupt("the sealed value is not base64"))?;
        let plain = key
            .cipher
            .decrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: &sealed,
                    aad: &aad(name, &env.key),
                },
            )
            .map_err(|_| {
                corrupt("it does not open under its key: altered, or sealed for another name")
            })?;
        String::from_utf8(plain).map_err(|_| corrupt("the value is not UTF-8"))
    }

    /// Appends a fresh key (it seals from now on) and writes the file.
    /// Answers the new key's id.
    pub fn add_key(&mut self) -> Result<String, KeyringError> {
        let bytes: [u8; KEY_BYTES] = random();
        let suffix: [u8; 4] = random();
        let id = format!(
            "k{}",
            suffix
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        let entry = KeyEntry {
            id: id.clone(),
            key: B64.encode(bytes),
            created_ms: crewlet_os::now_ms() as u64,
        };
        self.keys.push(Key {
            id: id.clone(),
            cipher: XChaCha20Poly1305::new_from_slice(&bytes).expect("a 32-byte key"),
            entry,
        });
        if let Err(e) = self.write() {
            self.keys.pop();
            return Err(e);
        }
        Ok(id)
    }

    /// Drops every key but the current one that no envelope uses
    /// (`in_use`), and writes the file. Answers the ids dropped.
    pub fn retire_unused(
        &mut self,
        in_use: &BTreeSet<String>,
    ) -> Result<Vec<String>, KeyringError> {
        let current = self.current().to_owned();
        let (keep, drop): (Vec<Key>, Vec<Key>) = std::mem::take(&mut self.keys)
            .into_iter()
            .partition(|k| k.id == current || in_use.contains(&k.id));
        self.keys = keep;
        let dropped: Vec<String> = drop.iter().map(|k| k.id.clone()).collect();
        if !dropped.is_empty()
            && let Err(e) = self.write()
        {
            self.keys.extend(drop);
            return Err(e);
        }
        Ok(dropped)
    }

    /// Writes the keyring to a 0600 file beside it, then renames it over.
    fn write(&self) -> Result<(), KeyringError> {
        let shown = self.path.display().to_string();
        let unwritable = |source| KeyringError::Unwritable {
            path: shown.clone(),
            source,
        };
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(unwritable)?;
        }
        let file = KeyringFile {
            keys: self.keys.iter().map(|k| k.entry.clone()).collect(),
        };
        let text = format!(
            "# crewlet keyring: the keys that seal this fleet's secrets.\n\
             # Keep it mode 600; copy the same file to every node of the fleet.\n\
             # The last key seals; every key listed opens.\n{}",
            toml::to_string(&file).expect("a keyring serialises")
        );
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(unwritable)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(unwritable)?;
        f.write_all(text.as_bytes()).map_err(unwritable)?;
        f.sync_all().map_err(unwritable)?;
        std::fs::rename(&tmp, &self.path).map_err(unwritable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(dir: &Path) -> Keyring {
        Keyring::open_or_create(&dir.join("keyring")).unwrap()
    }

    #[test]
    fn a_sealed_value_opens_under_its_name_only_and_holds_no_plaintext() {
        let dir = tempfile::tempdir().unwrap();
        let ring = ring(dir.path());
        let env = ring.seal("GITHUB_SECRET", "hunter2-distinct");
        let json = serde_json::to_string(&env).unwrap();
        assert!(!json.contains("hunter2"), "{json}");
        assert_eq!(env.key, ring.current());
        assert_eq!(
            ring.open_envelope("GITHUB_SECRET", &env).unwrap(),
            "hunter2-distinct"
        );
        let moved = ring.open_envelope("OTHER", &env).unwrap_err();
        assert!(matches!(moved, OpenError::Corrupt { ref name, .. } if name == "OTHER"));
        let mut bent = env.clone();
        bent.sealed.replace_range(0..4, "AAAA");
        let err = ring.open_envelope("GITHUB_SECRET", &bent).unwrap_err();
        assert!(err.to_string().contains("GITHUB_SECRET"), "{err}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn the_file_is_created_0600_and_loose_permissions_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keyring");
        let first = ring(dir.path());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = Keyring::open(&path).unwrap();
        assert_eq!(again.ids(), first.ids(), "the same keys load again");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = Keyring::open(&path).unwrap_err();
        assert!(matches!(
            err,
            KeyringError::LoosePermissions { mode: 0o640, .. }
        ));
        let text = err.to_string();
        assert!(
            text.contains(&path.display().to_string()) && text.contains("chmod 600"),
            "{text}"
        );
    }

    #[test]
    fn a_key_the_ring_lacks_is_named_and_rotation_keeps_old_keys_until_unused() {
        let dir = tempfile::tempdir().unwrap();
        let mut ring = ring(dir.path());
        let old = ring.current().to_owned();
        let env = ring.seal("A", "v");
        let new = ring.add_key().unwrap();
        assert_ne!(old, new);
        assert_eq!(ring.current(), new);
        assert_eq!(
            ring.open_envelope("A", &env).unwrap(),
            "v",
            "old keys still open"
        );
        let kept = ring.retire_unused(&BTreeSet::from([old.clone()])).unwrap();
        assert!(kept.is_empty());
        assert_eq!(
            ring.retire_unused(&BTreeSet::new()).unwrap(),
            vec![old.clone()]
        );
        let reloaded = Keyring::open(ring.path()).unwrap();
        assert_eq!(reloaded.ids(), vec![new]);
        let err = reloaded.open_envelope("A", &env).unwrap_err();
        assert_eq!(
            err,
            OpenError::NoKey {
                name: "A".into(),
                key: old
            }
        );
    }

    #[test]
    fn a_malformed_keyring_is_refused_without_quoting_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keyring");
        for (text, why) in [
            ("not toml at all = = secretish", "unreadable"),
            ("key = []\n", "no key"),
            (
                "[[key]]\nid = \"k1\"\nkey = \"c2hvcnQ=\"\ncreated_ms = 1\n",
                "not 32 bytes",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            let err = Keyring::open(&path).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
            assert!(
                !err.contains("secretish") && !err.contains("c2hvcnQ"),
                "{err}"
            );
        }
    }
}
