//! Authentication: bearer tokens mapped to tenants.
//!
//! The token file (`--auth-tokens`) holds one `TENANT SHA256_HEX` per line —
//! the hex SHA-256 of a bearer token, never the token itself; `#` starts a
//! comment; a malformed line is logged and skipped; a tenant may have
//! several lines (rotation). A background task re-reads the file when its
//! modification time, size or inode changes (checked every second, so a
//! change takes effect within 5 s whether the file is rewritten in place or
//! replaced by rename); an unreadable file keeps the old tokens.
//!
//! [`Authenticator`] answers whose a request is; the interceptor in
//! [`crate::admission`] asks it first, on the `SessionStore` service only
//! (health and reflection answer without credentials), and puts the
//! caller's tenant into the request.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use tonic::Request;

use crate::domain::Error;

/// The tenant of unauthenticated calls.
pub const DEFAULT_TENANT: &str = "default";

/// The tenant a request acts for, put in its extensions by the admission
/// layer once its token is checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant(pub String);

/// The tenant `request` acts for: the admitted one, or [`DEFAULT_TENANT`].
pub fn tenant_of<T>(request: &Request<T>) -> String {
    request
        .extensions()
        .get::<Tenant>()
        .map_or_else(|| DEFAULT_TENANT.to_owned(), |t| t.0.clone())
}

/// How often the token file is checked for changes.
const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// SHA-256 digests of bearer tokens → tenant.
type Tokens = HashMap<[u8; 32], String>;

/// Parses a token file's text. Malformed lines are logged and skipped.
pub fn parse_tokens(text: &str, path: &Path) -> Tokens {
    let mut tokens = Tokens::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let mut fields = line.split_whitespace();
        let parsed = match (fields.next(), fields.next(), fields.next()) {
            (Some(tenant), Some(hex), None) => decode_digest(hex).map(|d| (tenant, d)),
            _ => None,
        };
        match parsed {
            Some((tenant, digest)) => {
                tokens.insert(digest, tenant.to_owned());
            }
            None => tracing::warn!(
                path = %path.display(),
                line = number + 1,
                "malformed token line skipped (want: TENANT SHA256_HEX)"
            ),
        }
    }
    tokens
}

fn decode_digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut digest = [0_u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(digest)
}

/// What identifies one version of the file on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    let metadata = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&metadata);
    #[cfg(not(unix))]
    let inode = 0;
    Some(Stamp {
        modified: metadata.modified().ok(),
        len: metadata.len(),
        inode,
    })
}

/// Checks bearer tokens against the token file, or lets every call in as
/// the `default` tenant when there is none.
#[derive(Clone)]
pub struct Authenticator {
    tokens: Option<Arc<RwLock<Tokens>>>,
}

impl Authenticator {
    /// No token file: every call is the `default` tenant.
    pub fn open() -> Self {
        Authenticator { tokens: None }
    }

    /// Loads the token file (failing if it cannot be read at start) and
    /// keeps it fresh until the returned task is aborted.
    pub fn from_file(path: PathBuf) -> anyhow::Result<(Self, tokio::task::JoinHandle<()>)> {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| anyhow::anyhow!("cannot read the token file {}: {e}", path.display()))?;
        let tokens = parse_tokens(&text, &path);
        tracing::info!(path = %path.display(), tokens = tokens.len(), "loaded bearer tokens");
        let shared = Arc::new(RwLock::new(tokens));
        let reloader = tokio::spawn(reload(path, Arc::clone(&shared)));
        Ok((
            Authenticator {
                tokens: Some(shared),
            },
            reloader,
        ))
    }

    /// The tenant a request's `authorization` header names.
    pub fn tenant(&self, request: &Request<()>) -> Result<String, Error> {
        let Some(tokens) = &self.tokens else {
            return Ok(DEFAULT_TENANT.to_owned());
        };
        let header = request
            .metadata()
            .get("authorization")
            .ok_or(Error::Unauthenticated("no authorization: Bearer token"))?;
        let token = header
            .to_str()
            .ok()
            .and_then(bearer_token)
            .ok_or(Error::Unauthenticated(
                "the authorization header is not \"Bearer TOKEN\"",
            ))?;
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let tokens = tokens
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tokens
            .get(&digest)
            .cloned()
            .ok_or(Error::Unauthenticated("the bearer token is not valid"))
    }
}

/// The token of an `authorization` value `Bearer TOKEN`: the scheme in any
/// case (RFC 7235), then exactly one space; the rest, as sent, is the token.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

async fn reload(path: PathBuf, tokens: Arc<RwLock<Tokens>>) {
    let mut last = stamp(&path);
    let mut ticks = tokio::time::interval(RELOAD_CHECK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let now = stamp(&path);
        if now.is_none() || now == last {
            continue;
        }
        match tokio::fs::read_to_string(&path).await {
            Ok(text) => {
                let fresh = parse_tokens(&text, &path);
                let mut current = tokens
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if fresh.is_empty() && !current.is_empty() {
                    tracing::error!(
                        path = %path.display(),
                        "the reloaded token file has no valid token lines: every call will now be refused as unauthenticated"
                    );
                } else {
                    tracing::info!(path = %path.display(), tokens = fresh.len(), "reloaded bearer tokens");
                }
                *current = fresh;
                last = now;
            }
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "cannot read the token file; keeping the old tokens");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_lines_parse() {
        let digest = "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08";
        let text = format!(
            "# tenants\nacme {digest}\nacme {}  # rotated\n\nbad line\nshort abc\nx {digest} extra\n",
            digest.to_lowercase().replace("9f", "00")
        );
        let tokens = parse_tokens(&text, Path::new("tokens"));
        assert_eq!(tokens.len(), 2);
        let test_digest: [u8; 32] = Sha256::digest(b"test").into();
        assert_eq!(tokens.get(&test_digest).map(String::as_str), Some("acme"));
    }

    #[test]
    fn the_bearer_scheme_is_any_case_and_the_token_is_as_sent() {
        for value in ["Bearer tok", "bearer tok", "BEARER tok", "BeArEr tok"] {
            assert_eq!(bearer_token(value), Some("tok"), "{value:?}");
        }
        assert_eq!(bearer_token("Bearer  tok"), Some(" tok"));
        assert_eq!(bearer_token("Bearer tok "), Some("tok "));
        for value in ["Bearer", "Bearer ", "Basic tok", "Bearertok", "Bearer\ttok"] {
            assert_eq!(bearer_token(value), None, "{value:?}");
        }
    }
}
