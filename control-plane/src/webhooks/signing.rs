//! Standard Webhooks signing.
//!
//! A secret is `whsec_` and the base64 of 32 random bytes. Each message carries
//! `webhook-id` (stable across retries), `webhook-timestamp` (Unix seconds of the attempt) and
//! `webhook-signature`: `v1,` and the base64 HMAC-SHA256, keyed with the secret's bytes (the
//! base64 after `whsec_`, decoded), of `"{id}.{timestamp}.{body}"`. During a rotation's
//! overlap the header carries both signatures, space-separated, so a receiver holding either
//! secret verifies.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const PREFIX: &str = "whsec_";
/// Random bytes in a new secret (Standard Webhooks asks for 24 to 64).
pub const SECRET_BYTES: usize = 32;

/// A signing secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl Secret {
    pub fn generate() -> Secret {
        let bytes: [u8; SECRET_BYTES] = rand::random();
        Secret(bytes.to_vec())
    }

    /// Reads `whsec_<base64>`.
    pub fn parse(s: &str) -> Result<Secret, String> {
        let b64 = s
            .strip_prefix(PREFIX)
            .ok_or_else(|| format!("a secret starts with {PREFIX}"))?;
        let bytes = STANDARD
            .decode(b64)
            .map_err(|e| format!("the part after {PREFIX} is not base64: {e}"))?;
        if !(24..=64).contains(&bytes.len()) {
            return Err("a secret has 24 to 64 bytes".into());
        }
        Ok(Secret(bytes))
    }

    /// `whsec_<base64>`, as shown to the subscriber and stored.
    pub fn expose(&self) -> String {
        format!("{PREFIX}{}", STANDARD.encode(&self.0))
    }

    /// `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`.
    pub fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        // HMAC takes keys of any length; this cannot fail.
        let mut mac = match Hmac::<Sha256>::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => return String::new(),
        };
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

/// The `webhook-signature` header: one signature per secret, space-separated.
pub fn signature_header(secrets: &[&Secret], msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets
        .iter()
        .map(|s| s.sign(msg_id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_like_the_standard_webhooks_reference() {
        // The example of the Standard Webhooks specification's reference libraries.
        let s = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("secret");
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            s.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn secrets_round_trip_and_bad_ones_are_refused() {
        let s = Secret::generate();
        let text = s.expose();
        assert!(text.starts_with("whsec_"));
        assert_eq!(Secret::parse(&text), Ok(s.clone()));
        assert!(Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_err());
        assert!(Secret::parse("whsec_!!!").is_err());
        assert!(Secret::parse("whsec_AAAA").is_err());
        let other = Secret::generate();
        let h = signature_header(&[&s, &other], "m", 1, b"{}");
        let parts: Vec<_> = h.split(' ').collect();
        assert_eq!(parts, [s.sign("m", 1, b"{}"), other.sign("m", 1, b"{}")]);
    }
}
