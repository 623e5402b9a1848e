//! The keys that guard the node's secrets and its broker connection.
//!
//! - `[secrets] keyring`: the file whose keys seal the secrets bucket
//!   (default `<data dir>/keyring`). A fleet points every node at a copy of
//!   the same file; the node checks its permissions when it starts.
//! - `[stream]` credentials for an external NATS: one of `user` +
//!   `password`, `token`, `nkey_seed_file` or `creds_file`, and TLS with
//!   `tls_ca` (and `tls_cert` + `tls_key` for a client certificate). Values
//!   may come from the environment (`password = "${NATS_PASSWORD}"`). The
//!   embedded broker takes none of them: the node makes its own credential.

use std::path::PathBuf;

/// How the node proves itself to an external NATS.
#[derive(Clone, PartialEq, Eq)]
pub enum NatsCredentials {
    UserPassword {
        user: String,
        password: String,
    },
    Token(String),
    /// A file holding an nkey seed (`SU…`).
    NkeySeedFile(PathBuf),
    /// A `.creds` file (JWT and seed), as `nsc` writes it.
    CredsFile(PathBuf),
}

impl std::fmt::Debug for NatsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NatsCredentials::UserPassword { user, .. } => f
                .debug_struct("UserPassword")
                .field("user", user)
                .finish_non_exhaustive(),
            NatsCredentials::Token(_) => f.write_str("Token([redacted])"),
            NatsCredentials::NkeySeedFile(p) => f.debug_tuple("NkeySeedFile").field(p).finish(),
            NatsCredentials::CredsFile(p) => f.debug_tuple("CredsFile").field(p).finish(),
        }
    }
}

/// TLS towards an external NATS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatsTls {
    /// Root certificates the server's certificate must chain to.
    pub ca: Option<PathBuf>,
    /// A client certificate and its key, for servers that verify clients.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// Credentials and TLS for an external NATS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatsAuth {
    pub credentials: Option<NatsCredentials>,
    pub tls: Option<NatsTls>,
}

/// `[stream]`'s credential keys, as written.
#[derive(Debug, Default)]
pub(crate) struct RawAuth {
    pub user: Option<String>,
    pub password: Option<String>,
    pub token: Option<String>,
    pub nkey_seed_file: Option<PathBuf>,
    pub creds_file: Option<PathBuf>,
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
}

impl RawAuth {
    /// Every key that is set, by name (for "embedded takes none").
    pub(crate) fn set_keys(&self) -> Vec<&'static str> {
        [
            ("stream.user", self.user.is_some()),
            ("stream.password", self.password.is_some()),
            ("stream.token", self.token.is_some()),
            ("stream.nkey_seed_file", self.nkey_seed_file.is_some()),
            ("stream.creds_file", self.creds_file.is_some()),
            ("stream.tls_ca", self.tls_ca.is_some()),
            ("stream.tls_cert", self.tls_cert.is_some()),
            ("stream.tls_key", self.tls_key.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, set)| set.then_some(k))
        .collect()
    }

    /// Validates the keys into [`NatsAuth`]; an error is `(key, message)`.
    pub(crate) fn validate(
        self,
        resolve: impl Fn(PathBuf) -> PathBuf,
    ) -> Result<NatsAuth, (&'static str, String)> {
        let forms = [
            (
                "stream.user",
                self.user.is_some() || self.password.is_some(),
            ),
            ("stream.token", self.token.is_some()),
            ("stream.nkey_seed_file", self.nkey_seed_file.is_some()),
            ("stream.creds_file", self.creds_file.is_some()),
        ];
        let chosen: Vec<&str> = forms.iter().filter(|(_, s)| *s).map(|(k, _)| *k).collect();
        if chosen.len() > 1 {
            return Err((
                forms
                    .iter()
                    .filter(|(_, s)| *s)
                    .nth(1)
                    .map(|(k, _)| *k)
                    .unwrap_or("stream"),
                format!(
                    "give one way to authenticate to NATS, not several (found {}); keep one",
                    chosen.join(", ")
                ),
            ));
        }
        let nonempty = |key: &'static str, v: String| {
            if v.is_empty() {
                Err((key, "is empty; give a value or remove the key".to_owned()))
            } else {
                Ok(v)
            }
        };
        let credentials = match (self.user, self.password) {
            (Some(user), Some(password)) => Some(NatsCredentials::UserPassword {
                user: nonempty("stream.user", user)?,
                password: nonempty("stream.password", password)?,
            }),
            (Some(_), None) => {
                return Err((
                    "stream.password",
                    "`stream.user` needs a password; set `password = \"${NATS_PASSWORD}\"`".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(("stream.user", "`stream.password` needs a user name".into()));
            }
            (None, None) => None,
        };
        let credentials = match credentials {
            Some(c) => Some(c),
            None => match (self.token, self.nkey_seed_file, self.creds_file) {
                (Some(t), _, _) => Some(NatsCredentials::Token(nonempty("stream.token", t)?)),
                (_, Some(f), _) => Some(NatsCredentials::NkeySeedFile(resolve(f))),
                (_, _, Some(f)) => Some(NatsCredentials::CredsFile(resolve(f))),
                _ => None,
            },
        };
        let client = match (self.tls_cert, self.tls_key) {
            (Some(cert), Some(key)) => Some((resolve(cert), resolve(key))),
            (Some(_), None) => {
                return Err((
                    "stream.tls_key",
                    "`stream.tls_cert` needs its private key file".into(),
                ));
            }
            (None, Some(_)) => {
                return Err((
                    "stream.tls_cert",
                    "`stream.tls_key` needs its certificate file".into(),
                ));
            }
            (None, None) => None,
        };
        let tls = (self.tls_ca.is_some() || client.is_some()).then(|| NatsTls {
            ca: self.tls_ca.map(&resolve),
            client,
        });
        Ok(NatsAuth { credentials, tls })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::{ConfigError, NodeConfig, Overrides, StreamMode};

    use super::*;

    fn parse(text: &str) -> Result<NodeConfig, ConfigError> {
        let env = |name: &str| (name == "NATS_PASSWORD").then(|| "pw-from-env".to_owned());
        NodeConfig::from_toml(
            "node.toml",
            text,
            Path::new("/etc/crewlet"),
            &Overrides::default(),
            &env,
        )
    }

    fn auth(text: &str) -> NatsAuth {
        match parse(text).unwrap().stream.mode {
            StreamMode::External { auth, .. } => auth,
            other => panic!("{other:?}"),
        }
    }

    fn refused(text: &str) -> (String, String) {
        match parse(text).unwrap_err() {
            ConfigError::Invalid { key, message, .. } => (key, message),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn the_keyring_defaults_to_the_data_dir_and_resolves_against_the_file() {
        let cfg = parse("[node]\ndata_dir = \"/var/c\"\n").unwrap();
        assert_eq!(cfg.secrets.keyring, PathBuf::from("/var/c/keyring"));
        let cfg = parse("[secrets]\nkeyring = \"shared/keyring\"\n").unwrap();
        assert_eq!(
            cfg.secrets.keyring,
            PathBuf::from("/etc/crewlet/shared/keyring")
        );
    }

    #[test]
    fn external_nats_takes_one_credential_form_and_tls_files() {
        let a = auth(
            "[stream]\nurl = \"tls://n1:4222\"\nuser = \"crewlet\"\npassword = \"${NATS_PASSWORD}\"\ntls_ca = \"ca.pem\"\ntls_cert = \"c.pem\"\ntls_key = \"c.key\"\n",
        );
        assert_eq!(
            a.credentials,
            Some(NatsCredentials::UserPassword {
                user: "crewlet".into(),
                password: "pw-from-env".into()
            })
        );
        assert!(!format!("{a:?}").contains("pw-from-env"), "Debug hides it");
        let tls = a.tls.unwrap();
        assert_eq!(tls.ca, Some(PathBuf::from("/etc/crewlet/ca.pem")));
        assert_eq!(
            tls.client,
            Some((
                PathBuf::from("/etc/crewlet/c.pem"),
                PathBuf::from("/etc/crewlet/c.key")
            ))
        );
        let a = auth("[stream]\nurl = \"nats://n1\"\ncreds_file = \"/etc/nats/crewlet.creds\"\n");
        assert_eq!(
            a.credentials,
            Some(NatsCredentials::CredsFile("/etc/nats/crewlet.creds".into()))
        );
        assert_eq!(auth("[stream]\nurl = \"nats://n1\"\n"), NatsAuth::default());
    }

    #[test]
    fn conflicting_incomplete_or_misplaced_credentials_are_refused_by_key() {
        let (key, msg) =
            refused("[stream]\nurl = \"nats://n1\"\ntoken = \"t\"\nnkey_seed_file = \"s.nk\"\n");
        assert_eq!(key, "stream.nkey_seed_file");
        assert!(msg.contains("one way"), "{msg}");
        let (key, _) = refused("[stream]\nurl = \"nats://n1\"\nuser = \"u\"\n");
        assert_eq!(key, "stream.password");
        let (key, _) = refused("[stream]\nurl = \"nats://n1\"\ntls_cert = \"c.pem\"\n");
        assert_eq!(key, "stream.tls_key");
        let (key, msg) = refused("[stream]\ntoken = \"t\"\n");
        assert_eq!(key, "stream.token");
        assert!(msg.contains("embedded broker makes its own"), "{msg}");
        let (key, _) = refused("[stream]\nurl = \"nats://n1\"\ntoken = \"\"\n");
        assert_eq!(key, "stream.token");
    }
}
