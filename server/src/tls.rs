//! TLS on the gRPC port (rustls): a certificate chain and key, and
//! optionally a CA bundle that client certificates must chain to (mutual
//! TLS). Files are read once, at start; a bad file stops the server there.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use crate::config::TlsConfig;

/// How long a client may take over its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn read(path: &Path, flag: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {flag} {}", path.display()))
}

/// The server's TLS settings, or `None` to serve plaintext.
pub fn server_config(config: &TlsConfig) -> anyhow::Result<Option<ServerTlsConfig>> {
    let (cert, key) = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => (cert, key),
        (None, None) if config.tls_client_ca.is_none() => return Ok(None),
        _ => anyhow::bail!(
            "TLS needs both --tls-cert and --tls-key (and --tls-client-ca only with them)"
        ),
    };
    let identity = Identity::from_pem(read(cert, "--tls-cert")?, read(key, "--tls-key")?);
    let mut tls = ServerTlsConfig::new()
        .identity(identity)
        .timeout(HANDSHAKE_TIMEOUT);
    if let Some(ca) = &config.tls_client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(read(ca, "--tls-client-ca")?));
    }
    Ok(Some(tls))
}
