//! WatchSession and ExportHistory sent as the store keeps them.
//!
//! The generated service converts and encodes every message it sends. A
//! session's event goes to each of its watchers, so with 1,000 watchers
//! the same event was converted and encoded 1,000 times: a third of the
//! watchers' replica's CPU in the 1,000-watcher benchmark (`perf`). An
//! event is now encoded when it is written ([`EncodedEvent`]): the log
//! stores that encoding, the hub hands all of a session's watchers the
//! same bytes, and a replay frames what it reads from the log. Messages
//! are stored encoded too, and ExportHistory writes each one's stored
//! encoding into its chunk rather than decoding it and encoding it again.
//! [`EncodedStreams`] answers WatchSession and ExportHistory calls itself;
//! every other call goes to the generated service unchanged.
//!
//! The bytes sent are whole gRPC messages: the 5-byte prefix (not
//! compressed, length) and the encoded `SessionEvent` or
//! `ExportHistoryResponse`. Tonic still reads the request and answers
//! errors, but an accepted call's response body is [`FramedBody`], which
//! hands the HTTP/2 stream those bytes as they are. Through tonic's own
//! body every watcher copied the event into a buffer of its own, and paid
//! tonic's per-message work, before h2 wrote it.
//!
//! [`EncodedEvent`]: crate::wire::EncodedEvent

use std::convert::Infallible;
use std::marker::PhantomData;
use std::ops::Range;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{BufMut as _, Bytes, BytesMut};
use futures_util::StreamExt as _;
use http_body::Frame;
use prost::Message;
use sessionstore_client::server_codec::RequestDecoder;
use sessionstore_client::v1 as pb;
use sessionstore_client::v1::session_store_server::{SERVICE_NAME, SessionStoreServer};
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::codegen::{BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, ServerStreamingService};
use tonic::{Request, Response, Status};

use super::{BoxStream, SessionStoreService, item_to_pb};
use crate::store::Store;
use crate::watch::WatchItem;

/// The routes answered here, as the generated service names them.
const WATCH_SESSION: &str = "/sessionstore.v1.SessionStore/WatchSession";
const EXPORT_HISTORY: &str = "/sessionstore.v1.SessionStore/ExportHistory";

/// The `SessionStore` service, with WatchSession and ExportHistory
/// answered from stored encodings. See the module documentation.
pub struct EncodedStreams<S> {
    service: Arc<SessionStoreService<S>>,
    generated: SessionStoreServer<SessionStoreService<S>>,
    max_request_bytes: usize,
}

impl<S> Clone for EncodedStreams<S> {
    fn clone(&self) -> Self {
        EncodedStreams {
            service: Arc::clone(&self.service),
            generated: self.generated.clone(),
            max_request_bytes: self.max_request_bytes,
        }
    }
}

impl<S: Store> EncodedStreams<S> {
    /// Serves `service`, accepting requests of up to `max_request_bytes`.
    pub fn new(service: SessionStoreService<S>, max_request_bytes: usize) -> Self {
        let service = Arc::new(service);
        EncodedStreams {
            generated: SessionStoreServer::from_arc(Arc::clone(&service))
                .max_decoding_message_size(max_request_bytes)
                .max_encoding_message_size(usize::MAX),
            service,
            max_request_bytes,
        }
    }

    /// Answers `request` with the framed messages `open` makes of it.
    fn framed<Req, B>(
        &self,
        request: http::Request<B>,
        open: Open<S, Req>,
    ) -> BoxFuture<http::Response<tonic::body::Body>, Infallible>
    where
        Req: Message + Default + Send + 'static,
        B: http_body::Body + Send + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
        let messages: Arc<Slot> = Arc::new(Mutex::new(None));
        let call = FramedCall {
            service: Arc::clone(&self.service),
            messages: Arc::clone(&messages),
            open,
        };
        let mut grpc = Grpc::new(RequestCodec::<Req>::default())
            .apply_max_message_size_config(Some(self.max_request_bytes), Some(usize::MAX));
        Box::pin(async move {
            let response = grpc.server_streaming(call, request).await;
            // The call was accepted: keep tonic's headers, send the
            // messages. Otherwise tonic's response carries the error.
            let accepted = lock(&messages).take();
            Ok(match accepted {
                Some(messages) => {
                    let (parts, _empty) = response.into_parts();
                    http::Response::from_parts(
                        parts,
                        tonic::body::Body::new(FramedBody::new(messages)),
                    )
                }
                None => response,
            })
        })
    }
}

impl<S> NamedService for EncodedStreams<S> {
    const NAME: &'static str = SERVICE_NAME;
}

impl<S, B> Service<http::Request<B>> for EncodedStreams<S>
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
        match request.uri().path() {
            WATCH_SESSION => self.framed(request, open_watch::<S>),
            EXPORT_HISTORY => self.framed(request, open_export::<S>),
            _ => self.generated.call(request),
        }
    }
}

/// Opens a call answered here: its messages, framed.
type Open<S, Req> =
    fn(Arc<SessionStoreService<S>>, Request<Req>) -> BoxFuture<BoxStream<Outgoing>, Status>;

fn open_watch<S: Store>(
    service: Arc<SessionStoreService<S>>,
    request: Request<pb::WatchSessionRequest>,
) -> BoxFuture<BoxStream<Outgoing>, Status> {
    Box::pin(async move {
        let items = service.open_watch(request).await?;
        let events: BoxStream<Outgoing> = Box::pin(items.map(|item| item.and_then(|i| framed(&i))));
        Ok(events)
    })
}

fn open_export<S: Store>(
    service: Arc<SessionStoreService<S>>,
    request: Request<pb::ExportHistoryRequest>,
) -> BoxFuture<BoxStream<Outgoing>, Status> {
    Box::pin(async move {
        let chunks = service.open_export(request).await?;
        let chunks: BoxStream<Outgoing> = Box::pin(chunks.map(|chunk| chunk.map(Outgoing::alone)));
        Ok(chunks)
    })
}

/// One call answered here. Tonic gets an empty stream; the framed
/// messages are left in `messages` for [`FramedBody`].
struct FramedCall<S, Req> {
    service: Arc<SessionStoreService<S>>,
    messages: Arc<Slot>,
    open: Open<S, Req>,
}

impl<S: Store, Req: Send + 'static> ServerStreamingService<Req> for FramedCall<S, Req> {
    type Response = Infallible;
    type ResponseStream = futures_util::stream::Empty<Result<Infallible, Status>>;
    type Future = BoxFuture<Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: Request<Req>) -> Self::Future {
        let (service, slot) = (Arc::clone(&self.service), Arc::clone(&self.messages));
        let open = self.open;
        Box::pin(async move {
            let messages = open(service, request).await?;
            *lock(&slot) = Some(messages);
            Ok(Response::new(futures_util::stream::empty()))
        })
    }
}

type Slot = Mutex<Option<BoxStream<Outgoing>>>;

fn lock(slot: &Slot) -> std::sync::MutexGuard<'_, Option<BoxStream<Outgoing>>> {
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `item` as a framed `SessionEvent` message. An event was framed when it
/// was written or read from the log, once for all of its session's
/// watchers.
fn framed(item: &WatchItem) -> Result<Outgoing, Status> {
    match item {
        WatchItem::Event(event) => Ok(Outgoing {
            message: event.framed(),
            page: event.page().cloned(),
        }),
        other => item_to_pb(other).map(|message| Outgoing::alone(frame(&message))),
    }
}

/// One framed gRPC message to send, and the buffer it is a slice of when
/// it was read in a page of events ([`crate::wire::EncodedEvent::page`]).
struct Outgoing {
    message: Bytes,
    page: Option<Bytes>,
}

impl Outgoing {
    /// A message framed on its own.
    fn alone(message: Bytes) -> Self {
        Outgoing {
            message,
            page: None,
        }
    }

    fn len(&self) -> usize {
        self.message.len()
    }

    /// Where the message lies in its page, if it was read in one.
    fn in_page(&self) -> Option<(&Bytes, Range<usize>)> {
        let page = self.page.as_ref()?;
        let start = (self.message.as_ptr() as usize).checked_sub(page.as_ptr() as usize)?;
        let end = start + self.message.len();
        (end <= page.len()).then_some((page, start..end))
    }
}

/// `message` as one gRPC message: not compressed, its length (big-endian
/// `u32`), then its encoding.
fn frame(message: &impl Message) -> Bytes {
    let len = message.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    // A message is bounded by the request size limit, far below 4 GiB.
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    // Cannot fail: the buffer has room for the whole message.
    let _ = message.encode(&mut buf);
    buf.freeze()
}

/// A WatchSession response body: each message as framed bytes, then the
/// call's status as trailers, as tonic's body sends them.
///
/// Messages that are ready together go out as one HTTP/2 DATA frame, up
/// to [`COALESCE_BYTES`], as tonic's own body does: a replay's events are
/// read ahead and ready in runs, and one frame per event cost HTTP/2's
/// per-frame work on both sides for every event. A message that does not
/// fit goes out in the next frame, and a message alone in its frame (a
/// live event, or a large one) goes out as it is, with no copy, and so do
/// the events of a replay that were read in one page and follow one
/// another in its buffer. Nothing waits for a later message.
struct FramedBody {
    messages: BoxStream<Outgoing>,
    /// A message that did not fit in the last frame: the next one's first.
    next: Option<Outgoing>,
    /// The call's end, seen while messages before it were still to be sent.
    end: Option<Status>,
    ended: bool,
}

/// The most bytes of ready messages gathered into one DATA frame (tonic's
/// own body yields at the same size).
const COALESCE_BYTES: usize = 32 * 1024;

impl FramedBody {
    fn new(messages: BoxStream<Outgoing>) -> Self {
        FramedBody {
            messages,
            next: None,
            end: None,
            ended: false,
        }
    }

    /// The call's status as the trailers frame; the body ends after it.
    fn trailers(&mut self, status: Status) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.ended = true;
        let mut trailers = http::HeaderMap::new();
        Poll::Ready(Some(
            status
                .add_header(&mut trailers)
                .map(|()| Frame::trailers(trailers)),
        ))
    }
}

/// Messages gathered for one DATA frame: the first as it is; then, while
/// each next one follows the last in the same page of events, that page's
/// slice over them (a message that does not follow a run starts the next
/// frame); other messages copied into one buffer.
#[derive(Default)]
enum Gathered {
    #[default]
    Nothing,
    One(Outgoing),
    /// Messages that follow one another in `page`: `page[range]`.
    Run {
        page: Bytes,
        range: Range<usize>,
    },
    Many(BytesMut),
}

impl Gathered {
    fn push(&mut self, message: Outgoing) {
        *self = match std::mem::take(self) {
            Gathered::Nothing => Gathered::One(message),
            Gathered::One(first) => match first.in_page() {
                Some((page, range)) if follows(page, &range, &message) => Gathered::Run {
                    page: page.clone(),
                    range: range.start..range.end + message.len(),
                },
                _ => copied(&first.message, &message.message),
            },
            Gathered::Run { page, range } => {
                if follows(&page, &range, &message) {
                    let end = range.end + message.len();
                    Gathered::Run {
                        page,
                        range: range.start..end,
                    }
                } else {
                    copied(page.get(range).unwrap_or_default(), &message.message)
                }
            }
            Gathered::Many(mut buf) => {
                buf.extend_from_slice(&message.message);
                Gathered::Many(buf)
            }
        }
    }

    fn is_run(&self) -> bool {
        matches!(self, Gathered::Run { .. })
    }

    /// Whether `message` follows a run in its page.
    fn followed_by(&self, message: &Outgoing) -> bool {
        match self {
            Gathered::Run { page, range } => follows(page, range, message),
            _ => false,
        }
    }

    fn len(&self) -> usize {
        match self {
            Gathered::Nothing => 0,
            Gathered::One(message) => message.len(),
            Gathered::Run { range, .. } => range.len(),
            Gathered::Many(buf) => buf.len(),
        }
    }

    /// The gathered bytes as a DATA frame, or `None` if there are none.
    fn frame(self) -> Option<Frame<Bytes>> {
        match self {
            Gathered::Nothing => None,
            Gathered::One(message) => Some(Frame::data(message.message)),
            Gathered::Run { page, range } => Some(Frame::data(page.slice(range))),
            Gathered::Many(buf) => Some(Frame::data(buf.freeze())),
        }
    }
}

/// Whether `message` lies in `page` right after `range`.
fn follows(page: &Bytes, range: &Range<usize>, message: &Outgoing) -> bool {
    message.in_page().is_some_and(|(its_page, its_range)| {
        its_page.as_ptr() == page.as_ptr()
            && its_page.len() == page.len()
            && its_range.start == range.end
    })
}

/// `first` and `second` copied into one buffer, with room for more.
fn copied(first: &[u8], second: &[u8]) -> Gathered {
    let mut buf = BytesMut::with_capacity((first.len() + second.len()).max(COALESCE_BYTES));
    buf.extend_from_slice(first);
    buf.extend_from_slice(second);
    Gathered::Many(buf)
}

impl http_body::Body for FramedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if let Some(status) = self.end.take() {
            return self.trailers(status);
        }
        let mut gathered = Gathered::Nothing;
        if let Some(first) = self.next.take() {
            gathered.push(first);
        }
        let end = loop {
            if gathered.len() >= COALESCE_BYTES {
                break None;
            }
            match self.messages.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(message))) => {
                    // A run of one page's events ends where one does not
                    // fit or does not follow (the next buffer's first):
                    // the frame goes out uncopied.
                    if gathered.len() > 0 && gathered.len() + message.len() > COALESCE_BYTES
                        || gathered.is_run() && !gathered.followed_by(&message)
                    {
                        self.next = Some(message);
                        break None;
                    }
                    gathered.push(message);
                }
                Poll::Ready(Some(Err(status))) => break Some(status),
                Poll::Ready(None) => break Some(Status::ok("")),
                // Nothing more is ready: send what is, or wait.
                Poll::Pending => match gathered.frame() {
                    Some(frame) => return Poll::Ready(Some(Ok(frame))),
                    None => return Poll::Pending,
                },
            }
        };
        match (gathered.frame(), end) {
            (Some(frame), end) => {
                self.end = end;
                Poll::Ready(Some(Ok(frame)))
            }
            // The loop stops without an end only with bytes gathered.
            (None, end) => self.trailers(end.unwrap_or_else(|| Status::ok(""))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

/// Decodes requests as the generated server does (a request that does not
/// decode is INVALID_ARGUMENT). It encodes nothing: tonic's response
/// stream is empty ([`Infallible`] items), the messages go out through
/// [`FramedBody`].
struct RequestCodec<Req>(PhantomData<fn() -> Req>);

impl<Req> Default for RequestCodec<Req> {
    fn default() -> Self {
        RequestCodec(PhantomData)
    }
}

impl<Req: Message + Default + Send + 'static> Codec for RequestCodec<Req> {
    type Encode = Infallible;
    type Decode = Req;
    type Encoder = NoEncoder;
    type Decoder = RequestDecoder<Req>;

    fn encoder(&mut self) -> Self::Encoder {
        NoEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder::default()
    }
}

#[derive(Clone, Copy, Debug)]
struct NoEncoder;

impl Encoder for NoEncoder {
    type Item = Infallible;
    type Error = Status;

    fn encode(&mut self, item: Infallible, _buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        match item {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;

    /// Polls `body` once.
    fn poll(body: &mut FramedBody) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        http_body::Body::poll_frame(Pin::new(body), &mut cx)
    }

    /// The data of a polled frame, or what came instead.
    fn data(polled: Poll<Option<Result<Frame<Bytes>, Status>>>) -> Result<Bytes, String> {
        match polled {
            Poll::Ready(Some(Ok(frame))) => frame
                .into_data()
                .map_err(|frame| format!("not data: {frame:?}")),
            other => Err(format!("not a frame: {other:?}")),
        }
    }

    /// The `grpc-status` of a polled trailers frame.
    fn status(polled: Poll<Option<Result<Frame<Bytes>, Status>>>) -> Result<String, String> {
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                let trailers = frame
                    .into_trailers()
                    .map_err(|frame| format!("not trailers: {frame:?}"))?;
                trailers
                    .get("grpc-status")
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned)
                    .ok_or_else(|| format!("no grpc-status in {trailers:?}"))
            }
            other => Err(format!("not a frame: {other:?}")),
        }
    }

    fn body(items: Vec<Result<Bytes, Status>>) -> FramedBody {
        outgoing(
            items
                .into_iter()
                .map(|item| item.map(Outgoing::alone))
                .collect(),
        )
    }

    fn outgoing(items: Vec<Result<Outgoing, Status>>) -> FramedBody {
        FramedBody::new(Box::pin(stream::iter(items)))
    }

    /// Two pages' buffers, and their messages in order.
    type TwoPages = (Bytes, Bytes, Vec<Result<Outgoing, Status>>);

    /// Two pages' buffers of six bytes each, and their messages in
    /// order: of `first` and `second` bytes each.
    fn two_pages(first: &[usize], second: &[usize]) -> TwoPages {
        let pages = (Bytes::from_static(b"abcdef"), Bytes::from_static(b"ghijkl"));
        let mut items = in_page(&pages.0, first);
        items.extend(in_page(&pages.1, second));
        (pages.0, pages.1, items)
    }

    /// That `sent` is `bytes` themselves, not a copy.
    fn assert_uncopied(sent: &Bytes, bytes: &[u8]) {
        assert_eq!((sent.as_ptr(), sent.len()), (bytes.as_ptr(), bytes.len()));
    }

    /// The messages of one page of events, in its buffer `page`, which
    /// they fill: `lens` bytes each.
    fn in_page(page: &Bytes, lens: &[usize]) -> Vec<Result<Outgoing, Status>> {
        let mut start = 0;
        lens.iter()
            .map(|len| {
                let message = page.slice(start..start + len);
                start += len;
                Ok(Outgoing {
                    message,
                    page: Some(page.clone()),
                })
            })
            .collect()
    }

    #[test]
    fn a_run_of_one_page_goes_out_as_one_frame_of_its_buffer() -> Result<(), String> {
        let page = Bytes::from_static(b"onetwothree");
        let mut body = outgoing(in_page(&page, &[3, 3, 5]));
        assert_uncopied(&data(poll(&mut body))?, &page);
        assert_eq!(status(poll(&mut body))?, "0");
        Ok(())
    }

    #[test]
    fn messages_of_two_pages_or_out_of_order_are_copied_together() -> Result<(), String> {
        let (_, _, mut items) = two_pages(&[3, 3], &[6]);
        items.swap(0, 1);
        let mut body = outgoing(items);
        assert_eq!(data(poll(&mut body))?, Bytes::from_static(b"defabcghijkl"));
        assert_eq!(status(poll(&mut body))?, "0");
        Ok(())
    }

    #[test]
    fn a_run_ends_its_frame_where_the_next_buffer_begins() -> Result<(), String> {
        let (first, second, items) = two_pages(&[3, 3], &[2, 4]);
        let mut body = outgoing(items);
        assert_uncopied(&data(poll(&mut body))?, &first);
        assert_uncopied(&data(poll(&mut body))?, &second);
        assert_eq!(status(poll(&mut body))?, "0");
        Ok(())
    }

    #[test]
    fn a_run_that_does_not_fit_ends_its_frame() -> Result<(), String> {
        let half = COALESCE_BYTES / 2 + 1;
        let page = Bytes::from(vec![b'z'; 2 * half + 4]);
        let mut body = outgoing(in_page(&page, &[half, half, 4]));
        assert_uncopied(&data(poll(&mut body))?, &page[..half]);
        assert_uncopied(&data(poll(&mut body))?, &page[half..]);
        assert_eq!(status(poll(&mut body))?, "0");
        Ok(())
    }

    #[test]
    fn messages_ready_together_go_out_as_one_frame() -> Result<(), String> {
        let mut body = body(vec![
            Ok(Bytes::from_static(b"one")),
            Ok(Bytes::from_static(b"two")),
            Ok(Bytes::from_static(b"three")),
        ]);
        assert_eq!(data(poll(&mut body))?, Bytes::from_static(b"onetwothree"));
        assert_eq!(status(poll(&mut body))?, "0");
        assert!(matches!(poll(&mut body), Poll::Ready(None)));
        Ok(())
    }

    #[test]
    fn a_message_that_does_not_fit_starts_the_next_frame() -> Result<(), String> {
        let half = Bytes::from(vec![b'x'; COALESCE_BYTES / 2 + 1]);
        let mut body = body(vec![
            Ok(half.clone()),
            Ok(half.clone()),
            Ok(Bytes::from_static(b"last")),
        ]);
        assert_eq!(data(poll(&mut body))?.len(), half.len());
        assert_eq!(data(poll(&mut body))?.len(), half.len() + 4);
        assert_eq!(status(poll(&mut body))?, "0");
        Ok(())
    }

    #[test]
    fn a_large_message_goes_out_alone_and_uncopied() -> Result<(), String> {
        let large = Bytes::from(vec![b'y'; COALESCE_BYTES * 2]);
        let mut body = body(vec![
            Ok(Bytes::from_static(b"small")),
            Ok(large.clone()),
            Ok(Bytes::from_static(b"after")),
        ]);
        assert_eq!(data(poll(&mut body))?, Bytes::from_static(b"small"));
        let sent = data(poll(&mut body))?;
        assert_eq!(sent.as_ptr(), large.as_ptr(), "the shared bytes themselves");
        assert_eq!(data(poll(&mut body))?, Bytes::from_static(b"after"));
        assert_eq!(status(poll(&mut body))?, "0");
        Ok(())
    }

    #[test]
    fn an_error_after_messages_follows_them() -> Result<(), String> {
        let mut body = body(vec![
            Ok(Bytes::from_static(b"sent")),
            Err(Status::unavailable("gone")),
        ]);
        assert_eq!(data(poll(&mut body))?, Bytes::from_static(b"sent"));
        assert_eq!(
            status(poll(&mut body))?,
            (tonic::Code::Unavailable as i32).to_string()
        );
        assert!(matches!(poll(&mut body), Poll::Ready(None)));
        Ok(())
    }

    #[test]
    fn a_lone_message_is_sent_at_once_and_uncopied() -> Result<(), String> {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let mut body = FramedBody::new(Box::pin(
            tokio_stream::wrappers::UnboundedReceiverStream::new(receiver),
        ));
        assert!(poll(&mut body).is_pending());
        let live = Bytes::from_static(b"live event");
        sender
            .send(Ok(Outgoing::alone(live.clone())))
            .map_err(|e| e.to_string())?;
        let sent = data(poll(&mut body))?;
        assert_eq!(sent, live);
        assert_eq!(sent.as_ptr(), live.as_ptr(), "the shared bytes themselves");
        assert!(poll(&mut body).is_pending());
        drop(sender);
        assert_eq!(status(poll(&mut body))?, "0");
        Ok(())
    }
}
