//! WatchSession with each live event encoded once per session.
//!
//! The generated service converts and encodes every message it sends. A
//! session's event goes to each of its watchers, so with 1,000 watchers
//! the same event was converted and encoded 1,000 times: a third of the
//! watchers' replica's CPU in the 1,000-watcher benchmark (`perf`). The
//! hub hands all of a session's watchers one [`Outgoing`] per event;
//! [`EncodedWatch`] answers WatchSession calls itself, with a codec that
//! sends bytes, and the first watcher to send an event encodes it for the
//! rest. Every other call goes to the generated service unchanged.
//!
//! [`Outgoing`]: crate::watch::Outgoing

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut as _, Bytes};
use futures_util::StreamExt as _;
use prost::Message as _;
use sessionstore_client::v1 as pb;
use sessionstore_client::v1::session_store_server::{SERVICE_NAME, SessionStoreServer};
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::codegen::{BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, ServerStreamingService};
use tonic::{Request, Response, Status};

use super::{BoxStream, SessionStoreService, convert, item_to_pb};
use crate::store::Store;
use crate::watch::WatchItem;

/// The WatchSession route, as the generated service names it.
const WATCH_SESSION: &str = "/sessionstore.v1.SessionStore/WatchSession";

/// The `SessionStore` service, with WatchSession answered from encoded
/// events. See the module documentation.
pub struct EncodedWatch<S> {
    service: Arc<SessionStoreService<S>>,
    generated: SessionStoreServer<SessionStoreService<S>>,
    max_request_bytes: usize,
}

impl<S> Clone for EncodedWatch<S> {
    fn clone(&self) -> Self {
        EncodedWatch {
            service: Arc::clone(&self.service),
            generated: self.generated.clone(),
            max_request_bytes: self.max_request_bytes,
        }
    }
}

impl<S: Store> EncodedWatch<S> {
    /// Serves `service`, accepting requests of up to `max_request_bytes`.
    pub fn new(service: SessionStoreService<S>, max_request_bytes: usize) -> Self {
        let service = Arc::new(service);
        EncodedWatch {
            generated: SessionStoreServer::from_arc(Arc::clone(&service))
                .max_decoding_message_size(max_request_bytes)
                .max_encoding_message_size(usize::MAX),
            service,
            max_request_bytes,
        }
    }
}

impl<S> NamedService for EncodedWatch<S> {
    const NAME: &'static str = SERVICE_NAME;
}

impl<S, B> Service<http::Request<B>> for EncodedWatch<S>
where
    S: Store,
    B: http_body::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != WATCH_SESSION {
            return self.generated.call(request);
        }
        let call = WatchCall(Arc::clone(&self.service));
        let mut grpc = Grpc::new(EncodedCodec)
            .apply_max_message_size_config(Some(self.max_request_bytes), Some(usize::MAX));
        Box::pin(async move { Ok(grpc.server_streaming(call, request).await) })
    }
}

/// One WatchSession call.
struct WatchCall<S>(Arc<SessionStoreService<S>>);

impl<S: Store> ServerStreamingService<pb::WatchSessionRequest> for WatchCall<S> {
    type Response = Bytes;
    type ResponseStream = BoxStream<Bytes>;
    type Future = BoxFuture<Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: Request<pb::WatchSessionRequest>) -> Self::Future {
        let service = Arc::clone(&self.0);
        Box::pin(async move {
            let items = service.open_watch(request).await?;
            let stream: BoxStream<Bytes> = Box::pin(items.map(|item| item.map(|i| encode(&i))));
            Ok(Response::new(stream))
        })
    }
}

/// `item` as an encoded `SessionEvent`. A live event is encoded once for
/// all of its session's watchers.
fn encode(item: &WatchItem) -> Bytes {
    match item {
        WatchItem::Event(outgoing) => {
            outgoing.encoded(|event| convert::event_to_pb(event).encode_to_vec().into())
        }
        other => item_to_pb(other).encode_to_vec().into(),
    }
}

/// Decodes requests with prost and sends responses that are already
/// encoded messages.
#[derive(Clone, Copy, Debug, Default)]
struct EncodedCodec;

impl Codec for EncodedCodec {
    type Encode = Bytes;
    type Decode = pb::WatchSessionRequest;
    type Encoder = BytesEncoder;
    type Decoder = tonic_prost::ProstDecoder<pb::WatchSessionRequest>;

    fn encoder(&mut self) -> Self::Encoder {
        BytesEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::default()
    }
}

/// Writes an encoded message as it is.
#[derive(Clone, Copy, Debug)]
struct BytesEncoder;

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item);
        Ok(())
    }
}
