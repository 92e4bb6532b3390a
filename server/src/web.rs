//! Browsers: gRPC-Web on the gRPC listener, and CORS for the origins the
//! operator allows.
//!
//! tonic-web turns each gRPC-Web call (`application/grpc-web`, or
//! `application/grpc-web-text`) into a gRPC call before it reaches any
//! other layer, so authentication, tenancy, limits, metrics and errors are
//! the same for a page as for any gRPC client. The CORS layer sits outside
//! it: it answers preflights and adds its headers only for allowed origins;
//! with none configured, a browser refuses every cross-origin page.

use std::time::Duration;

use anyhow::Context as _;
use http::{HeaderName, HeaderValue, Method};
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::config::ServeConfig;

/// Request headers a gRPC-Web page sends, allowed by name.
const ALLOWED_HEADERS: [&str; 5] = [
    "authorization",
    "content-type",
    "x-grpc-web",
    "x-user-agent",
    "grpc-timeout",
];
/// Response headers the page may read: the call's status and its details.
const EXPOSED_HEADERS: [&str; 3] = ["grpc-status", "grpc-message", "grpc-status-details-bin"];
/// How long a browser may cache a preflight's answer.
const PREFLIGHT_MAX_AGE: Duration = Duration::from_secs(600);

/// An origin as browsers send it, `scheme://host[:port]` (a trailing `/`
/// is dropped), as a header value to compare with.
fn origin_header(origin: &str) -> anyhow::Result<HeaderValue> {
    let bare = origin.trim_end_matches('/');
    let host = bare
        .strip_prefix("https://")
        .or_else(|| bare.strip_prefix("http://"));
    let well_formed = host.is_some_and(|host| {
        !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b'?' | b'#' | b'@'))
    });
    anyhow::ensure!(
        well_formed,
        "--cors-allowed-origins: {origin:?} is not an origin (scheme://host[:port], e.g. https://chat.example.com)"
    );
    HeaderValue::from_str(bare).context("--cors-allowed-origins")
}

/// The CORS layer for `--cors-allowed-origins`; refuses `*` without tokens.
pub fn cors(config: &ServeConfig) -> anyhow::Result<CorsLayer> {
    let origins = &config.cors_allowed_origins;
    let any = origins.iter().any(|origin| origin.trim() == "*");
    let allow_origin = if any {
        anyhow::ensure!(
            config.auth_tokens.is_some(),
            "--cors-allowed-origins '*' lets any web page call the service: it needs --auth-tokens"
        );
        AllowOrigin::any()
    } else {
        let values = origins
            .iter()
            .map(|origin| origin.trim())
            .filter(|origin| !origin.is_empty())
            .map(origin_header)
            .collect::<anyhow::Result<Vec<_>>>()?;
        AllowOrigin::list(values)
    };
    Ok(CorsLayer::new()
        .allow_origin(allow_origin)
        .allow_methods([Method::POST, Method::OPTIONS])
        .allow_headers(ALLOWED_HEADERS.map(HeaderName::from_static))
        .expose_headers(EXPOSED_HEADERS.map(HeaderName::from_static))
        .max_age(PREFLIGHT_MAX_AGE))
}
