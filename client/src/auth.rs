//! The bearer-token interceptor and the generated client it wraps: shared
//! by [`Client`](crate::Client) and its watch streams.

use std::fmt;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::error::{Error, Result};
use crate::v1::session_store_client::SessionStoreClient;

/// The generated client over a [`Client`](crate::Client)'s channel, with
/// its bearer token interceptor: every RPC, including those `Client` has no
/// typed method for yet. Get one with [`Client::raw`](crate::Client::raw).
pub type RawClient = SessionStoreClient<InterceptedService<Channel, BearerAuth>>;

/// The interceptor that adds `authorization: Bearer TOKEN` to every call
/// (nothing when the client has no token). Its `Debug` output hides the
/// token.
#[derive(Clone, Default)]
pub struct BearerAuth {
    header: Option<MetadataValue<Ascii>>,
}

impl BearerAuth {
    /// An interceptor sending `token`; fails if the token cannot be a
    /// header value (it must be visible ASCII).
    pub fn new(token: &str) -> Result<Self> {
        let header = format!("Bearer {token}")
            .parse::<MetadataValue<Ascii>>()
            .map_err(|_| {
                Error::InvalidConfig("the bearer token must be visible ASCII".to_owned())
            })?;
        Ok(BearerAuth {
            header: Some(header),
        })
    }
}

impl fmt::Debug for BearerAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let token = if self.header.is_some() {
            "<redacted>"
        } else {
            "<none>"
        };
        f.debug_struct("BearerAuth").field("token", &token).finish()
    }
}

impl Interceptor for BearerAuth {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(header) = &self.header {
            request
                .metadata_mut()
                .insert("authorization", header.clone());
        }
        Ok(request)
    }
}
