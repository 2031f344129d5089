//! Team secrets at rest: the control plane's key, and sealing and opening one value.
//!
//! A value is sealed with XChaCha20-Poly1305 under the control plane's 32-byte key, with a
//! random 24-byte nonce per write (random nonces of this size do not repeat in practice) and
//! the owning team's id and the secret's name as associated data. The database therefore holds
//! `nonce ‖ ciphertext ‖ tag` and nothing readable, and a sealed value copied to another team
//! or name fails to open, as does one sealed under another key or altered in any byte.
//!
//! Webhook signing secrets are sealed the same way under the same key, with associated data of
//! their own: a versioned prefix that differs from team secrets', the subscription's id and
//! the slot (`current` or `previous`). A sealed value therefore opens only in the row and
//! column it was written for, and never as the other kind.
//!
//! The key comes from `secrets.key` (base64, for replicas sharing one) or the file
//! `secrets.key_file`, created with 32 random bytes, readable by its owner only, on the first
//! start. Losing it loses every secret: docs/deploy.md says to back it up.
//!
//! # Rotation
//!
//! `secrets.previous_keys` lists keys that still open (never seal): opening tries the current
//! key, then each previous one in order. `spotplane secrets reseal` seals every stored value
//! under the current key ([`crate::store::Store::reseal_secrets`]); after it, the previous
//! keys can be removed.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use spotplane_core::FieldErrors;

/// Bytes of a key.
pub const KEY_LEN: usize = 32;
/// Bytes of the nonce that starts a sealed value.
const NONCE_LEN: usize = 24;
/// The largest value a secret may hold, in bytes.
pub const MAX_VALUE_BYTES: usize = spotplane_core::limits::SECRET_VALUE_BYTES.max as usize;
/// Separates the parts of the associated data, and names its layout.
const AAD_PREFIX: &[u8] = b"spotplane team secret v1\0";
/// The same for webhook signing secrets: differs from [`AAD_PREFIX`], so neither kind opens as
/// the other.
const WEBHOOK_AAD_PREFIX: &[u8] = b"spotplane webhook signing secret v1\0";

/// The control plane's secrets key: the one that seals, and the previous ones that still open
/// (`secrets.previous_keys`). Its `Debug` shows nothing of them.
#[derive(Clone)]
pub struct SecretsKey {
    cipher: XChaCha20Poly1305,
    previous: Vec<XChaCha20Poly1305>,
}

impl fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SecretsKey(<redacted>, {} previous)",
            self.previous.len()
        )
    }
}

/// Which column of a webhook subscription a sealed signing secret belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookSlot {
    /// `secret`: the one every delivery is signed with.
    Current,
    /// `previous_secret`: the rotated-out one, signed with during the overlap.
    Previous,
}

impl WebhookSlot {
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookSlot::Current => "current",
            WebhookSlot::Previous => "previous",
        }
    }
}

/// What opening found: the value, and whether the current key opened it (if not, a previous
/// one did, and `reseal` has work to do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub value: String,
    pub under_current: bool,
}

/// Why the key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("secrets.key: {0}")]
    BadText(String),
    #[error(
        "secrets key file {path}: {reason}; restore it from its backup (it must hold the 32 bytes it was created with), or move it away to start with a new key and lose every stored secret"
    )]
    Corrupt { path: PathBuf, reason: String },
    #[error("secrets.previous_keys[{index}]: {reason}")]
    BadPrevious { index: usize, reason: String },
    #[error("secrets key file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A sealed value that does not open: another key, another team or name, or altered bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot be decrypted with this control plane's secrets key or any of secrets.previous_keys (sealed under a key not configured, or the row was altered or moved)"
)]
pub struct OpenError;

impl SecretsKey {
    pub fn from_bytes(bytes: &[u8; KEY_LEN]) -> SecretsKey {
        SecretsKey {
            cipher: XChaCha20Poly1305::new(&(*bytes).into()),
            previous: Vec::new(),
        }
    }

    /// This key, also opening what `previous` (tried in order, after this one) sealed.
    pub fn with_previous(mut self, previous: impl IntoIterator<Item = SecretsKey>) -> SecretsKey {
        self.previous.extend(previous.into_iter().map(|k| k.cipher));
        self
    }

    /// A fresh random key (for tests and first starts).
    pub fn generate() -> SecretsKey {
        SecretsKey::from_bytes(&rand::random())
    }

    /// Reads a key given as base64 (standard alphabet, padded or not).
    pub fn from_base64(text: &str) -> Result<SecretsKey, KeyError> {
        let text = text.trim();
        let bytes = STANDARD
            .decode(text)
            .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(text))
            .map_err(|_| KeyError::BadText("is not base64".into()))?;
        let bytes: [u8; KEY_LEN] = bytes.try_into().map_err(|b: Vec<u8>| {
            KeyError::BadText(format!(
                "must be {KEY_LEN} bytes in base64, not {} bytes",
                b.len()
            ))
        })?;
        Ok(SecretsKey::from_bytes(&bytes))
    }

    /// The key the settings name: `key` when set, else the file, created when absent.
    /// Also opens with `previous_keys`.
    pub fn load(settings: &SecretsSettings) -> Result<SecretsKey, KeyError> {
        let previous = settings
            .previous_keys
            .iter()
            .enumerate()
            .map(|(index, k)| {
                SecretsKey::from_base64(k.expose()).map_err(|e| KeyError::BadPrevious {
                    index,
                    reason: e.to_string().trim_start_matches("secrets.key: ").to_owned(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let current = match &settings.key {
            Some(text) => SecretsKey::from_base64(text.expose())?,
            None => SecretsKey::load_or_create_file(&settings.key_file)?,
        };
        Ok(current.with_previous(previous))
    }

    /// Reads the key file, or creates it (and its folder) with a new random key, readable and
    /// writable by its owner only. A file that is there but not a key is refused, naming it:
    /// starting with a new key would make every stored secret unreadable.
    pub fn load_or_create_file(path: &Path) -> Result<SecretsKey, KeyError> {
        let io = |source| KeyError::Io {
            path: path.to_owned(),
            source,
        };
        match std::fs::read(path) {
            Ok(bytes) => {
                let bytes: [u8; KEY_LEN] =
                    bytes.try_into().map_err(|b: Vec<u8>| KeyError::Corrupt {
                        path: path.to_owned(),
                        reason: format!("holds {} bytes, not {KEY_LEN}", b.len()),
                    })?;
                owner_only(path).map_err(io)?;
                Ok(SecretsKey::from_bytes(&bytes))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(io)?;
                }
                let bytes: [u8; KEY_LEN] = rand::random();
                write_new_private(path, &bytes).map_err(io)?;
                tracing::warn!(path = %path.display(), "created a new secrets key; back it up (losing it loses every team secret)");
                Ok(SecretsKey::from_bytes(&bytes))
            }
            Err(e) => Err(io(e)),
        }
    }

    /// Seals `value` for the secret `name` of the team `team_id`: nonce, then ciphertext and tag.
    pub fn seal(&self, team_id: &str, name: &str, value: &str) -> Vec<u8> {
        self.seal_with(&associated_data(AAD_PREFIX, team_id, name), value)
    }

    /// Opens what [`SecretsKey::seal`] made for the same team and name.
    pub fn open(&self, team_id: &str, name: &str, sealed: &[u8]) -> Result<String, OpenError> {
        self.open_detailed(team_id, name, sealed).map(|o| o.value)
    }

    /// [`SecretsKey::open`], saying which key opened it.
    pub fn open_detailed(
        &self,
        team_id: &str,
        name: &str,
        sealed: &[u8],
    ) -> Result<Opened, OpenError> {
        self.open_with(&associated_data(AAD_PREFIX, team_id, name), sealed)
    }

    /// Seals a webhook signing secret for the column `slot` of the subscription
    /// `subscription_id`.
    pub fn seal_webhook(&self, subscription_id: &str, slot: WebhookSlot, value: &str) -> Vec<u8> {
        let aad = associated_data(WEBHOOK_AAD_PREFIX, subscription_id, slot.as_str());
        self.seal_with(&aad, value)
    }

    /// Opens what [`SecretsKey::seal_webhook`] made for the same subscription and slot.
    pub fn open_webhook(
        &self,
        subscription_id: &str,
        slot: WebhookSlot,
        sealed: &[u8],
    ) -> Result<Opened, OpenError> {
        let aad = associated_data(WEBHOOK_AAD_PREFIX, subscription_id, slot.as_str());
        self.open_with(&aad, sealed)
    }

    fn seal_with(&self, aad: &[u8], value: &str) -> Vec<u8> {
        let nonce_bytes: [u8; NONCE_LEN] = rand::random();
        let nonce = XNonce::from(nonce_bytes);
        // Encrypting into a Vec fails only for messages beyond the cipher's limit (256 GiB),
        // far above MAX_VALUE_BYTES.
        let sealed = self
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: value.as_bytes(),
                    aad,
                },
            )
            .unwrap_or_default();
        let mut out = Vec::with_capacity(NONCE_LEN + sealed.len());
        out.extend_from_slice(&nonce_bytes);
        out.extend_from_slice(&sealed);
        out
    }

    /// Tries the current key, then each previous one.
    fn open_with(&self, aad: &[u8], sealed: &[u8]) -> Result<Opened, OpenError> {
        if sealed.len() < NONCE_LEN {
            return Err(OpenError);
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
        let nonce: [u8; NONCE_LEN] = nonce.try_into().map_err(|_| OpenError)?;
        let nonce = XNonce::from(nonce);
        let payload = || Payload {
            msg: ciphertext,
            aad,
        };
        let (plain, under_current) = match self.cipher.decrypt(&nonce, payload()) {
            Ok(p) => (p, true),
            Err(_) => (
                self.previous
                    .iter()
                    .find_map(|c| c.decrypt(&nonce, payload()).ok())
                    .ok_or(OpenError)?,
                false,
            ),
        };
        let value = String::from_utf8(plain).map_err(|_| OpenError)?;
        Ok(Opened {
            value,
            under_current,
        })
    }
}

/// What binds a sealed value to its place: the owner's id (team or subscription) and the name
/// (a secret's name, or a webhook slot), each ended by a NUL (none can hold one), after a
/// versioned prefix naming the kind.
fn associated_data(prefix: &[u8], owner: &str, name: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(prefix.len() + owner.len() + name.len() + 2);
    aad.extend_from_slice(prefix);
    aad.extend_from_slice(owner.as_bytes());
    aad.push(0);
    aad.extend_from_slice(name.as_bytes());
    aad.push(0);
    aad
}

/// A secret's name as a path segment or a list cursor holds it: checked like every spotplane
/// name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SecretName(String);

impl SecretName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for SecretName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        spotplane_core::validate::check_secret_name(s)?;
        Ok(SecretName(s.to_owned()))
    }
}

impl fmt::Display for SecretName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks a secret to store: its name as every spotplane name, its value at most
/// [`MAX_VALUE_BYTES`] and without NUL (it becomes an environment variable). The messages
/// never quote the value.
pub fn validate_secret(name: &str, value: &str) -> FieldErrors {
    let mut errs = FieldErrors::new();
    errs.check_name("name", name);
    if value.is_empty() {
        errs.push("value", "must not be empty");
    }
    if value.len() > MAX_VALUE_BYTES {
        errs.push_over(
            "value",
            &spotplane_core::limits::SECRET_VALUE_BYTES,
            format_args!("has {} bytes", value.len()),
        );
    }
    if value.contains('\0') {
        errs.push(
            "value",
            "must not contain a NUL character (it becomes an environment variable)",
        );
    }
    errs
}

/// `secrets` in the configuration.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecretsSettings {
    /// The file holding the key (32 raw bytes), created on the first start when absent. A
    /// relative path is read from serve's working directory.
    pub key_file: PathBuf,
    /// The key itself, in base64, instead of the file: for replicas sharing one database
    /// (`SPOTPLANE_SECRETS__KEY`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<KeyText>,
    /// Keys a rotation replaced, in base64: they still open values sealed under them (tried
    /// after the current key, in order), never seal. Remove them after `spotplane secrets
    /// reseal`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub previous_keys: Vec<KeyText>,
}

impl Default for SecretsSettings {
    fn default() -> Self {
        SecretsSettings {
            key_file: PathBuf::from("data/secrets.key"),
            key: None,
            previous_keys: Vec::new(),
        }
    }
}

impl SecretsSettings {
    /// Adds the settings' problems to `errs` (the file is checked when it is read, at start).
    pub fn validate(&self, errs: &mut FieldErrors) {
        if let Some(k) = &self.key
            && let Err(e) = SecretsKey::from_base64(k.expose())
        {
            let text = e.to_string();
            errs.push(
                "secrets.key",
                text.strip_prefix("secrets.key: ")
                    .unwrap_or(&text)
                    .to_owned(),
            );
        }
        for (i, k) in self.previous_keys.iter().enumerate() {
            if let Err(e) = SecretsKey::from_base64(k.expose()) {
                let text = e.to_string();
                errs.push(
                    format!("secrets.previous_keys[{i}]"),
                    text.strip_prefix("secrets.key: ")
                        .unwrap_or(&text)
                        .to_owned(),
                );
            }
        }
        if self.key.is_none() && self.key_file.as_os_str().is_empty() {
            errs.push(
                "secrets.key_file",
                "must name a file when secrets.key is not set",
            );
        }
    }

    /// Makes a relative key file absolute against the current directory.
    pub fn resolve_relative_paths(&mut self) {
        if self.key_file.is_relative()
            && !self.key_file.as_os_str().is_empty()
            && let Ok(cwd) = std::env::current_dir()
        {
            self.key_file = cwd.join(&self.key_file);
        }
    }
}

/// The key as configured text: kept out of `Debug` output and serialized redacted, so a
/// printed configuration does not show it.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct KeyText(String);

impl KeyText {
    pub fn new(text: impl Into<String>) -> KeyText {
        KeyText(text.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for KeyText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl serde::Serialize for KeyText {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("<redacted>")
    }
}

/// Creates `path` with `data`, readable and writable by its owner only; an existing file is
/// not replaced.
fn write_new_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path)?;
    f.write_all(data)?;
    f.sync_all()
}

/// Takes group and other access away from an existing key file.
fn owner_only(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)?.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o700))?;
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_for_its_team_and_name_only() {
        let key = SecretsKey::generate();
        let sealed = key.seal("team-1", "hf-token", "hf_abcdef");
        assert_eq!(
            key.open("team-1", "hf-token", &sealed).as_deref(),
            Ok("hf_abcdef")
        );
        assert!(
            !sealed.windows("hf_abcdef".len()).any(|w| w == b"hf_abcdef"),
            "no plaintext in the sealed bytes"
        );
        let cases: [(&str, &str, &str, Vec<u8>); 5] = [
            ("another team", "team-2", "hf-token", sealed.clone()),
            ("another name", "team-1", "hf-token2", sealed.clone()),
            ("the boundary moved", "team-1h", "f-token", sealed.clone()),
            ("truncated", "team-1", "hf-token", sealed[..20].to_vec()),
            ("empty", "team-1", "hf-token", Vec::new()),
        ];
        for (what, team, name, bytes) in cases {
            assert_eq!(key.open(team, name, &bytes), Err(OpenError), "{what}");
        }
        for i in 0..sealed.len() {
            let mut t = sealed.clone();
            t[i] ^= 0x01;
            assert_eq!(
                key.open("team-1", "hf-token", &t),
                Err(OpenError),
                "byte {i} flipped"
            );
        }
        assert_eq!(
            SecretsKey::generate().open("team-1", "hf-token", &sealed),
            Err(OpenError),
            "another key"
        );
    }

    #[test]
    fn a_webhook_secret_opens_for_its_subscription_and_slot_only_and_never_as_a_team_secret() {
        let key = SecretsKey::generate();
        let sealed = key.seal_webhook("sub-1", WebhookSlot::Current, "whsec_x");
        let opened = key
            .open_webhook("sub-1", WebhookSlot::Current, &sealed)
            .expect("opens");
        assert_eq!(opened.value, "whsec_x");
        assert!(opened.under_current);
        assert_eq!(
            key.open_webhook("sub-2", WebhookSlot::Current, &sealed),
            Err(OpenError),
            "another subscription"
        );
        assert_eq!(
            key.open_webhook("sub-1", WebhookSlot::Previous, &sealed),
            Err(OpenError),
            "the other column"
        );
        // The same owner and name strings as a team secret: the kinds' prefixes differ.
        assert_eq!(key.open("sub-1", "current", &sealed), Err(OpenError));
        let team = key.seal("sub-1", "current", "whsec_x");
        assert_eq!(
            key.open_webhook("sub-1", WebhookSlot::Current, &team),
            Err(OpenError)
        );
    }

    #[test]
    fn previous_keys_open_in_order_after_the_current_one_and_never_seal() {
        let (a, b, c) = (
            SecretsKey::generate(),
            SecretsKey::generate(),
            SecretsKey::generate(),
        );
        let under_a = a.seal("t", "n", "va");
        let under_b = b.seal("t", "n", "vb");
        let ring = c.clone().with_previous([a.clone(), b.clone()]);
        assert_eq!(format!("{ring:?}"), "SecretsKey(<redacted>, 2 previous)");
        for (sealed, want) in [(&under_a, "va"), (&under_b, "vb")] {
            let o = ring
                .open_detailed("t", "n", sealed)
                .expect("a previous key opens");
            assert_eq!(o.value, want);
            assert!(!o.under_current);
        }
        let fresh = ring.seal("t", "n", "vc");
        let o = ring.open_detailed("t", "n", &fresh).expect("opens");
        assert!(o.under_current);
        assert_eq!(
            c.open("t", "n", &fresh).as_deref(),
            Ok("vc"),
            "sealed under c"
        );
        assert_eq!(a.open("t", "n", &fresh), Err(OpenError));
        assert_eq!(
            SecretsKey::generate()
                .with_previous([c])
                .open("t", "n", &under_a),
            Err(OpenError),
            "a key in neither place"
        );
    }

    #[test]
    fn previous_keys_are_checked_by_index_and_loaded_after_the_current_one() {
        let (a, b) = ([1u8; KEY_LEN], [2u8; KEY_LEN]);
        let s = SecretsSettings {
            key: Some(KeyText::new(STANDARD.encode(b))),
            previous_keys: vec![KeyText::new(STANDARD.encode(a))],
            ..SecretsSettings::default()
        };
        let mut errs = FieldErrors::new();
        s.validate(&mut errs);
        assert!(errs.is_empty());
        let ring = SecretsKey::load(&s).expect("loads");
        let under_a = SecretsKey::from_bytes(&a).seal("t", "n", "v");
        assert_eq!(ring.open("t", "n", &under_a).as_deref(), Ok("v"));
        assert!(!format!("{s:?}").contains(&STANDARD.encode(a)));

        let bad = SecretsSettings {
            previous_keys: vec![KeyText::new(STANDARD.encode(a)), KeyText::new("not a key")],
            ..s
        };
        let mut errs = FieldErrors::new();
        bad.validate(&mut errs);
        let fields: Vec<_> = errs.iter().map(|e| e.field.clone()).collect();
        assert_eq!(fields, ["secrets.previous_keys[1]"]);
        let err = SecretsKey::load(&bad).expect_err("refused");
        assert_eq!(err.to_string(), "secrets.previous_keys[1]: is not base64");
    }

    #[test]
    fn each_write_has_a_nonce_of_its_own() {
        let key = SecretsKey::generate();
        let a = key.seal("t", "n", "same");
        let b = key.seal("t", "n", "same");
        assert_ne!(a[..NONCE_LEN], b[..NONCE_LEN]);
        assert_ne!(a, b);
    }

    #[test]
    fn the_key_file_is_created_private_once_and_a_corrupt_one_is_refused_by_path() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("data").join("secrets.key");
        let first = SecretsKey::load_or_create_file(&path).expect("created");
        let meta = std::fs::metadata(&path).expect("exists");
        assert_eq!(meta.len(), KEY_LEN as u64);
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let sealed = first.seal("t", "n", "v");
        let again = SecretsKey::load_or_create_file(&path).expect("read back");
        assert_eq!(
            again.open("t", "n", &sealed).as_deref(),
            Ok("v"),
            "same key"
        );

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        SecretsKey::load_or_create_file(&path).expect("still read");
        let mode = std::fs::metadata(&path)
            .expect("exists")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "group and other access taken away");

        std::fs::write(&path, b"not a key\n").expect("write");
        let err = SecretsKey::load_or_create_file(&path).expect_err("corrupt");
        let text = err.to_string();
        assert!(
            text.contains(&path.display().to_string()) && text.contains("10 bytes"),
            "{text}"
        );
    }

    #[test]
    fn a_configured_key_must_be_32_bytes_of_base64() {
        let good = STANDARD.encode([7u8; KEY_LEN]);
        assert!(SecretsKey::from_base64(&good).is_ok());
        assert!(SecretsKey::from_base64(good.trim_end_matches('=')).is_ok());
        for bad in ["", "***", &STANDARD.encode([7u8; 16])] {
            let mut errs = FieldErrors::new();
            SecretsSettings {
                key: Some(KeyText::new(bad)),
                ..SecretsSettings::default()
            }
            .validate(&mut errs);
            let fields: Vec<_> = errs.iter().map(|e| e.field.clone()).collect();
            assert_eq!(fields, ["secrets.key"], "{bad:?}");
        }
        let s = SecretsSettings {
            key: Some(KeyText::new(good.clone())),
            ..SecretsSettings::default()
        };
        assert!(!format!("{s:?}").contains(&good));
        assert!(
            !serde_json::to_string(&s)
                .expect("serializes")
                .contains(&good)
        );
    }

    #[test]
    fn secrets_are_checked_without_quoting_the_value() {
        let long = "x".repeat(MAX_VALUE_BYTES + 1);
        let cases: [(&str, &str, &[&str]); 6] = [
            ("hf-token", "v", &[]),
            ("hf-token", &long, &["value"]),
            ("hf-token", "a\0b", &["value"]),
            ("hf-token", "", &["value"]),
            ("Bad Name", "v", &["name"]),
            ("", "", &["name", "value"]),
        ];
        for (name, value, fields) in cases {
            let errs = validate_secret(name, value);
            let got: Vec<_> = errs.iter().map(|e| e.field.as_str()).collect();
            assert_eq!(got, fields, "{name:?}");
            for e in errs.iter() {
                assert!(
                    value.len() < 2 || !e.message.contains(value),
                    "{}",
                    e.message
                );
            }
        }
        assert!(validate_secret("n", &"x".repeat(MAX_VALUE_BYTES)).is_empty());
    }
}
