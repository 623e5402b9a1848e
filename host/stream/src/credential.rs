//! The embedded broker's one credential, and how the node dials any NATS.
//!
//! Rules, and why:
//! - **No client without a key.** The embedded nats-server admits exactly
//!   one user, an nkey whose seed the node generates at its first start into
//!   `<data dir>/broker.nkey` (mode 0600). The server's config file holds the
//!   public key only, so nothing the server writes can be replayed as a
//!   login; a local process that cannot read the node's data dir cannot
//!   read the secrets bucket, the streams or anything else.
//! - **A loose seed file is refused** like a loose keyring: someone else may
//!   hold it.
//! - **External NATS**: the node dials with what Tier A names (user and
//!   password, token, nkey seed file or creds file; TLS CA and client
//!   certificate); see `crewlet_config::NatsAuth`.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crewlet_config::{NatsAuth, NatsCredentials};

use crate::StreamError;

/// The embedded broker's user: an nkey pair.
pub struct BrokerCredential {
    path: PathBuf,
    seed: String,
    public: String,
}

impl std::fmt::Debug for BrokerCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerCredential")
            .field("path", &self.path)
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

fn bad(path: &Path, why: String) -> StreamError {
    StreamError::Credential {
        path: path.display().to_string(),
        why,
    }
}

/// Reads an nkey seed file, refusing group or other permissions.
fn read_seed(path: &Path) -> Result<String, StreamError> {
    let meta = std::fs::metadata(path).map_err(|e| bad(path, e.to_string()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(bad(
            path,
            format!(
                "it is readable or writable by others (mode {mode:03o}); run `chmod 600 {}`",
                path.display()
            ),
        ));
    }
    let seed = std::fs::read_to_string(path).map_err(|e| bad(path, e.to_string()))?;
    let seed = seed.trim().to_owned();
    // nkeys' message can quote the input: say what, not the seed.
    nkeys::KeyPair::from_seed(&seed)
        .map_err(|_| bad(path, "it does not hold an nkey seed (`SU…`)".into()))?;
    Ok(seed)
}

impl BrokerCredential {
    /// Loads the seed at `path`, or makes one there (mode 0600) when none
    /// exists.
    pub fn load_or_create(path: &Path) -> Result<BrokerCredential, StreamError> {
        let seed = if path.exists() {
            read_seed(path)?
        } else {
            let seed = nkeys::KeyPair::new_user()
                .seed()
                .map_err(|e| bad(path, e.to_string()))?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| bad(path, e.to_string()))?;
            }
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| bad(path, e.to_string()))?;
            f.set_permissions(std::fs::Permissions::from_mode(0o600))
                .and_then(|()| f.write_all(format!("{seed}\n").as_bytes()))
                .and_then(|()| f.sync_all())
                .map_err(|e| bad(path, e.to_string()))?;
            seed
        };
        let public = nkeys::KeyPair::from_seed(&seed)
            .map_err(|e| bad(path, e.to_string()))?
            .public_key();
        Ok(BrokerCredential {
            path: path.to_owned(),
            seed,
            public,
        })
    }

    /// The user's public key: what the server's config lists.
    pub fn public_key(&self) -> &str {
        &self.public
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Connect options that log in as this user.
    pub fn options(&self) -> async_nats::ConnectOptions {
        async_nats::ConnectOptions::with_nkey(self.seed.clone())
    }
}

/// How a connection authenticates, as `/health` shows it (never a value).
pub(crate) fn describe(auth: &NatsAuth) -> &'static str {
    match &auth.credentials {
        None => "none",
        Some(NatsCredentials::UserPassword { .. }) => "user-password",
        Some(NatsCredentials::Token(_)) => "token",
        Some(NatsCredentials::NkeySeedFile(_)) => "nkey",
        Some(NatsCredentials::CredsFile(_)) => "creds-file",
    }
}

/// Connect options carrying an external server's credentials and TLS.
pub(crate) async fn external_options(
    auth: &NatsAuth,
) -> Result<async_nats::ConnectOptions, StreamError> {
    let mut options = match &auth.credentials {
        None => async_nats::ConnectOptions::new(),
        Some(NatsCredentials::UserPassword { user, password }) => {
            async_nats::ConnectOptions::with_user_and_password(user.clone(), password.clone())
        }
        Some(NatsCredentials::Token(token)) => {
            async_nats::ConnectOptions::with_token(token.clone())
        }
        Some(NatsCredentials::NkeySeedFile(path)) => {
            async_nats::ConnectOptions::with_nkey(read_seed(path)?)
        }
        Some(NatsCredentials::CredsFile(path)) => {
            async_nats::ConnectOptions::with_credentials_file(path)
                .await
                .map_err(|e| {
                    bad(
                        path,
                        format!("not a readable NATS creds file ({})", e.kind()),
                    )
                })?
        }
    };
    if let Some(tls) = &auth.tls {
        options = options.require_tls(true);
        if let Some(ca) = &tls.ca {
            options = options.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &tls.client {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_is_made_once_0600_and_a_loose_or_bad_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.nkey");
        let first = BrokerCredential::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(first.public_key().starts_with('U'));
        let again = BrokerCredential::load_or_create(&path).unwrap();
        assert_eq!(again.public_key(), first.public_key(), "made once");
        // The seed is the file's one secret: Debug shows the path and the
        // public key, never the seed itself (a two-letter prefix check
        // would match a random public key one run in twenty).
        assert!(
            !format!("{again:?}").contains(again.seed.as_str()),
            "Debug hides the seed"
        );
        assert!(again.seed.starts_with("SU"), "an nkey user seed");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = BrokerCredential::load_or_create(&path)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("chmod 600") && err.contains("broker.nkey"),
            "{err}"
        );

        std::fs::write(&path, "SUNOTASEEDATALL\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = BrokerCredential::load_or_create(&path)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("nkey seed") && !err.contains("SUNOTASEED"),
            "{err}"
        );
    }
}
