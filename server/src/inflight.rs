//! Request bodies at the edge: a server-wide bound on the request bytes in
//! flight, and a body that is not well-formed gRPC answered as the
//! caller's error.
//!
//! [`InFlightLayer`] wraps every request body of every gRPC service. As
//! the body's bytes flow to tonic it follows the gRPC framing (a flag
//! byte, a 4-byte big-endian length, the message) and charges the request
//! for what tonic holds: the whole of a message from the moment its length
//! prefix arrives (tonic reserves that much buffer at once), capped at
//! `--max-request-bytes` (tonic refuses a longer one), plus the messages
//! completed in the latest chunk until tonic has decoded them. A charge
//! that would take the server's total past `--max-request-bytes-in-flight`
//! ends the request with RESOURCE_EXHAUSTED (reason `LIMIT_EXCEEDED`,
//! `limit` = `max_request_bytes_in_flight`), even part-way through its
//! body; tonic finds the `Status` in the body's error and answers with it.
//! The charge is given back as tonic decodes, when the body ends, and when
//! it is dropped.
//!
//! The framing it follows also shows when a body is broken: one that ends
//! inside a message (a prefix cut short, fewer bytes than the prefix
//! claims), a flag other than 0 (or 1 with a `grpc-encoding`), or, for a
//! method whose request is one message, no message at all. tonic answers
//! those INTERNAL; here they are INVALID_ARGUMENT with reason
//! `MALFORMED_REQUEST`, like a message that does not decode.
//!
//! Credentials are checked before any of the body is read: the interceptor
//! runs on the headers, and tonic polls the body only after it, so an
//! unauthenticated call is charged nothing.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use sessionstore_client::server_codec::malformed_request;
use tonic::Status;

/// The gRPC message prefix: a flag byte and a 4-byte length.
const PREFIX: usize = 5;

/// The request bytes the server holds, against a bound.
#[derive(Debug)]
pub struct InFlight {
    bound: usize,
    max_request_bytes: usize,
    held: AtomicUsize,
}

impl InFlight {
    /// At most `bound` bytes in flight; a single message is at most
    /// `max_request_bytes`.
    pub fn new(bound: usize, max_request_bytes: usize) -> Arc<Self> {
        Arc::new(InFlight {
            bound,
            max_request_bytes,
            held: AtomicUsize::new(0),
        })
    }

    /// The request bytes held now.
    pub fn bytes(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Takes `bytes` more, unless that would pass the bound.
    fn acquire(&self, bytes: usize) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|total| *total <= self.bound)
            })
            .is_ok()
    }

    fn release(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::AcqRel);
    }

    fn refusal(&self) -> Status {
        crate::grpc::limit_exceeded(
            "max_request_bytes_in_flight",
            format!(
                "the server holds as many request bytes as it may (--max-request-bytes-in-flight, {} bytes); retry later",
                self.bound
            ),
        )
    }
}

/// Paths (`/package.Service/Method`) of the methods whose request is one
/// message, from encoded `FileDescriptorSet`s.
pub fn single_message_methods(descriptor_sets: &[&[u8]]) -> HashSet<String> {
    crate::metrics::described_methods(descriptor_sets)
        .into_iter()
        .filter(|method| !method.client_streaming)
        .map(|method| format!("/{}/{}", method.service, method.name))
        .collect()
}

/// The tower layer that wraps every request body; see the module
/// documentation.
#[derive(Clone)]
pub struct InFlightLayer {
    in_flight: Arc<InFlight>,
    single_message: Arc<HashSet<String>>,
}

impl InFlightLayer {
    /// Charges requests to `in_flight`; `single_message` lists the methods
    /// (by path) whose request is exactly one message.
    pub fn new(in_flight: Arc<InFlight>, single_message: HashSet<String>) -> Self {
        InFlightLayer {
            in_flight,
            single_message: Arc::new(single_message),
        }
    }
}

impl<S> tower::Layer<S> for InFlightLayer {
    type Service = InFlightService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlightService {
            inner,
            layer: self.clone(),
        }
    }
}

/// See [`InFlightLayer`].
#[derive(Clone)]
pub struct InFlightService<S> {
    inner: S,
    layer: InFlightLayer,
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for InFlightService<S>
where
    S: tower::Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let single_message = self.layer.single_message.contains(request.uri().path());
        // tonic itself refuses an encoding it does not support.
        let compressed = request
            .headers()
            .get("grpc-encoding")
            .is_some_and(|encoding| encoding != "identity");
        let in_flight = Arc::clone(&self.layer.in_flight);
        self.inner.call(request.map(|body| {
            tonic::body::Body::new(ChargedBody {
                inner: body,
                in_flight,
                held: 0,
                framing: Framing::default(),
                single_message,
                compressed,
                ended: false,
            })
        }))
    }
}

/// Where the body is in the gRPC framing.
#[derive(Debug, Default)]
struct Framing {
    /// The bytes of the current prefix received so far.
    prefix: [u8; PREFIX],
    prefix_len: usize,
    /// The current message's claimed length, while its bytes are arriving.
    body: Option<Partial>,
    /// Messages received whole.
    messages: usize,
}

/// A message whose bytes are arriving.
#[derive(Debug, Clone, Copy)]
struct Partial {
    claimed: usize,
    remaining: usize,
}

/// A request body charged to [`InFlight`] as it arrives.
struct ChargedBody {
    inner: tonic::body::Body,
    in_flight: Arc<InFlight>,
    /// What this body holds of `in_flight` now.
    held: usize,
    framing: Framing,
    single_message: bool,
    compressed: bool,
    /// An error was returned, or the body ended.
    ended: bool,
}

impl ChargedBody {
    /// Follows the framing through `data` and returns the bytes tonic holds
    /// once it has `data`: the messages completed in it (not yet decoded)
    /// and the whole of the message under way (its prefix so far).
    fn follow(&mut self, data: &[u8]) -> Result<usize, Status> {
        let max = self.in_flight.max_request_bytes;
        let framing = &mut self.framing;
        let mut completed = 0_usize;
        let mut rest = data;
        while !rest.is_empty() {
            if let Some(message) = &mut framing.body {
                let take = message.remaining.min(rest.len());
                message.remaining -= take;
                rest = &rest[take..];
                if message.remaining == 0 {
                    completed = completed.saturating_add(PREFIX + message.claimed.min(max));
                    framing.body = None;
                    framing.messages += 1;
                }
                continue;
            }
            let take = (PREFIX - framing.prefix_len).min(rest.len());
            framing.prefix[framing.prefix_len..framing.prefix_len + take]
                .copy_from_slice(&rest[..take]);
            framing.prefix_len += take;
            rest = &rest[take..];
            if framing.prefix_len < PREFIX {
                break;
            }
            framing.prefix_len = 0;
            match framing.prefix[0] {
                0 => {}
                1 if self.compressed => {}
                1 => {
                    return Err(malformed_request(
                        "a gRPC message is flagged compressed, but the request names no grpc-encoding",
                    ));
                }
                flag => {
                    return Err(malformed_request(format!(
                        "a gRPC message has the flag byte {flag}; only 0 and 1 are valid"
                    )));
                }
            }
            let [_, length @ ..] = framing.prefix;
            let claimed = u32::from_be_bytes(length) as usize;
            if claimed == 0 {
                completed += PREFIX;
                framing.messages += 1;
            } else {
                framing.body = Some(Partial {
                    claimed,
                    remaining: claimed,
                });
            }
        }
        let under_way = match &framing.body {
            Some(message) => PREFIX + message.claimed.min(max),
            None => framing.prefix_len,
        };
        Ok(completed.saturating_add(under_way))
    }

    /// Holds `bytes` of the bound instead of what it held.
    fn hold(&mut self, bytes: usize) -> Result<(), Status> {
        if bytes > self.held {
            if !self.in_flight.acquire(bytes - self.held) {
                return Err(self.in_flight.refusal());
            }
        } else {
            self.in_flight.release(self.held - bytes);
        }
        self.held = bytes;
        Ok(())
    }

    /// Whether the body may end here: between messages, and after its one
    /// message if it must have one.
    fn may_end(&self) -> bool {
        let framing = &self.framing;
        framing.body.is_none()
            && framing.prefix_len == 0
            && !(self.single_message && framing.messages == 0)
    }

    /// Why a body that ends here is broken, if it is.
    fn broken_end(&self) -> Option<Status> {
        let framing = &self.framing;
        if let Some(message) = &framing.body {
            return Some(malformed_request(format!(
                "the request ended inside a gRPC message: {} of the {} bytes its prefix claims",
                message.claimed - message.remaining,
                message.claimed
            )));
        }
        if framing.prefix_len > 0 {
            return Some(malformed_request(format!(
                "the request ended inside a gRPC message prefix: {} of its 5 bytes",
                framing.prefix_len
            )));
        }
        (self.single_message && framing.messages == 0)
            .then(|| malformed_request("the request has no message"))
    }

    /// Ends the body with `status` (or cleanly), holding nothing.
    fn end(&mut self, status: Option<Status>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.ended = true;
        self.in_flight.release(self.held);
        self.held = 0;
        Poll::Ready(status.map(Err))
    }
}

impl Body for ChargedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                let broken = self.broken_end();
                self.end(broken)
            }
            Poll::Ready(Some(Err(status))) => self.end(Some(status)),
            Poll::Ready(Some(Ok(frame))) => {
                let Some(data) = frame.data_ref() else {
                    return Poll::Ready(Some(Ok(frame)));
                };
                let charged = self.follow(data).and_then(|bytes| self.hold(bytes));
                match charged {
                    Ok(()) => Poll::Ready(Some(Ok(frame))),
                    Err(status) => self.end(Some(status)),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // A body that ends broken is not over until it has said so.
        self.ended || (self.inner.is_end_stream() && self.may_end())
    }
}

impl Drop for ChargedBody {
    fn drop(&mut self) {
        self.in_flight.release(self.held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_never_passed_and_comes_back() {
        let in_flight = InFlight::new(10, 8);
        assert!(in_flight.acquire(6));
        assert!(!in_flight.acquire(5));
        assert!(in_flight.acquire(4));
        assert_eq!(in_flight.bytes(), 10);
        in_flight.release(10);
        assert_eq!(in_flight.bytes(), 0);
    }
}
