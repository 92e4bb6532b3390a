//! Prometheus metrics. A tower layer around every gRPC service counts each
//! call by method and status code and times it to its end (the trailers of
//! a stream); gauges (watch streams, request bytes in flight, database
//! pool) are read at scrape time.
//! `GET /metrics` on `--metrics-listen` serves them as Prometheus text.
//!
//! Method labels come from a fixed list built at start, so a client cannot
//! grow the label set by calling made-up methods: those count as `unknown`.
//!
//! The same layer writes one debug line per finished call (target
//! `sessionstore_server::rpc`: method, session, code, duration), when debug
//! logging is on for it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use prost::Message as _;
use tokio::net::TcpListener;
use tonic::Code;

/// The log target of the per-call lines.
const RPC_LOG_TARGET: &str = "sessionstore_server::rpc";

tokio::task_local! {
    /// The session the current call names, noted by its handler for the
    /// call's log line (set only while that line is wanted).
    static CALL_SESSION: Arc<OnceLock<String>>;
}

/// Notes the session the current call is about, for its log line. Cheap
/// when per-call logging is off.
pub fn note_session(session_id: &str) {
    let _ = CALL_SESSION.try_with(|slot| slot.set(session_id.to_owned()));
}

/// Upper bounds of the latency histogram's buckets, in seconds.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// gRPC status codes 0 through 16.
const CODES: usize = 17;

/// Counters of one method.
struct MethodStats {
    service: String,
    method: String,
    started: AtomicU64,
    handled: [AtomicU64; CODES],
    /// Cumulative counts are computed at scrape time; these are per bucket,
    /// with one extra for +Inf.
    buckets: [AtomicU64; BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

impl MethodStats {
    fn new(service: &str, method: &str) -> Self {
        MethodStats {
            service: service.to_owned(),
            method: method.to_owned(),
            started: AtomicU64::new(0),
            handled: std::array::from_fn(|_| AtomicU64::new(0)),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_nanos: AtomicU64::new(0),
        }
    }

    fn finish(&self, code: Code, started: Instant) {
        let elapsed = started.elapsed();
        let index = (code as usize).min(CODES - 1);
        self.handled[index].fetch_add(1, Ordering::Relaxed);
        let seconds = elapsed.as_secs_f64();
        let bucket = BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(BUCKETS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

/// Database pool figures, read at scrape time.
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolStatus {
    /// Open connections.
    pub connections: u32,
    /// Of which idle.
    pub idle: usize,
    /// The most the pool opens.
    pub max: u32,
    /// Writes waiting for a writer task (SQLite: every write; PostgreSQL: appends).
    pub queued_writes: Option<usize>,
    /// PostgreSQL's append writers' batches so far.
    pub append_batches: Option<BatchFigures>,
}

/// What the PostgreSQL append writers have done since the store opened:
/// how many batches, how large, how many round trips each took, and how
/// long they kept the writers busy (read at scrape time).
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchFigures {
    /// Writers on this replica.
    pub writers: usize,
    /// Batches tried (a batch redone counts again).
    pub batches: u64,
    /// Appends in those batches.
    pub appends: u64,
    /// Statements sent to the database for them, `BEGIN` and `COMMIT`
    /// included, each one round trip.
    pub round_trips: u64,
    /// Microseconds the writers spent in batches, summed over writers.
    pub busy_micros: u64,
    /// Batches being written now.
    pub in_flight: u64,
}

type PoolProbe = Box<dyn Fn() -> PoolStatus + Send + Sync>;
type BytesProbe = Box<dyn Fn() -> usize + Send + Sync>;

/// Every figure the server reports.
pub struct Metrics {
    /// By gRPC path, `/package.Service/Method`.
    methods: HashMap<String, Arc<MethodStats>>,
    unknown: Arc<MethodStats>,
    appended_exchanges: AtomicU64,
    appended_messages: AtomicU64,
    watch_streams: AtomicU64,
    pool: OnceLock<PoolProbe>,
    request_bytes: OnceLock<BytesProbe>,
    stream_buffer: OnceLock<BytesProbe>,
    active_runs: OnceLock<BytesProbe>,
}

/// A method named in a `FileDescriptorSet`.
pub struct DescribedMethod {
    /// The service's full name (`package.Service`).
    pub service: String,
    pub name: String,
    /// Whether the client sends a stream of messages.
    pub client_streaming: bool,
}

/// Every method of every service in these encoded `FileDescriptorSet`s
/// (sets that do not decode are skipped).
pub fn described_methods(descriptor_sets: &[&[u8]]) -> Vec<DescribedMethod> {
    let mut methods = Vec::new();
    for encoded in descriptor_sets {
        let Ok(set) = prost_types::FileDescriptorSet::decode(*encoded) else {
            continue;
        };
        for file in set.file {
            let package = file.package();
            for service in &file.service {
                let service_name = if package.is_empty() {
                    service.name().to_owned()
                } else {
                    format!("{package}.{}", service.name())
                };
                methods.extend(service.method.iter().map(|method| DescribedMethod {
                    service: service_name.clone(),
                    name: method.name().to_owned(),
                    client_streaming: method.client_streaming(),
                }));
            }
        }
    }
    methods
}

impl Metrics {
    /// Metrics for the methods of every service in these encoded
    /// `FileDescriptorSet`s.
    pub fn new(descriptor_sets: &[&[u8]]) -> Self {
        let mut methods = HashMap::new();
        for method in described_methods(descriptor_sets) {
            methods.insert(
                format!("/{}/{}", method.service, method.name),
                Arc::new(MethodStats::new(&method.service, &method.name)),
            );
        }
        // Reflection has no descriptor set of its own to hand.
        for service in [
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        ] {
            let path = format!("/{service}/ServerReflectionInfo");
            methods.insert(
                path,
                Arc::new(MethodStats::new(service, "ServerReflectionInfo")),
            );
        }
        Metrics {
            methods,
            unknown: Arc::new(MethodStats::new("unknown", "unknown")),
            appended_exchanges: AtomicU64::new(0),
            appended_messages: AtomicU64::new(0),
            watch_streams: AtomicU64::new(0),
            pool: OnceLock::new(),
            request_bytes: OnceLock::new(),
            stream_buffer: OnceLock::new(),
            active_runs: OnceLock::new(),
        }
    }

    /// Where pool figures come from (set once, when the store is open).
    pub fn set_pool_probe(&self, probe: impl Fn() -> PoolStatus + Send + Sync + 'static) {
        let _ = self.pool.set(Box::new(probe));
    }

    /// Where the request bytes in flight are read (set once, at start).
    pub fn set_request_bytes_probe(&self, probe: impl Fn() -> usize + Send + Sync + 'static) {
        let _ = self.request_bytes.set(Box::new(probe));
    }

    /// Where the bytes active runs' buffered partial output holds are read (set once).
    pub fn set_active_run_probe(&self, probe: impl Fn() -> usize + Send + Sync + 'static) {
        let _ = self.active_runs.set(Box::new(probe));
    }

    /// Where the bytes streams hold read ahead come from (set once).
    pub fn set_stream_buffer_probe(&self, probe: impl Fn() -> usize + Send + Sync + 'static) {
        let _ = self.stream_buffer.set(Box::new(probe));
    }

    /// Counts one committed AppendExchange of `messages` messages.
    pub fn exchange_appended(&self, messages: usize) {
        self.appended_exchanges.fetch_add(1, Ordering::Relaxed);
        self.appended_messages
            .fetch_add(messages as u64, Ordering::Relaxed);
    }

    /// A watch stream opened; the guard counts it until dropped.
    pub fn watch_stream(self: &Arc<Self>) -> WatchStreamGauge {
        self.watch_streams.fetch_add(1, Ordering::Relaxed);
        WatchStreamGauge(Arc::clone(self))
    }

    fn stats(&self, path: &str) -> &Arc<MethodStats> {
        self.methods.get(path).unwrap_or(&self.unknown)
    }

    /// The Prometheus text exposition of everything.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        let mut methods: Vec<&Arc<MethodStats>> = self.methods.values().collect();
        methods.push(&self.unknown);
        methods.sort_by(|a, b| (&a.service, &a.method).cmp(&(&b.service, &b.method)));

        out.push_str("# HELP grpc_server_started_total Total number of RPCs started on the server.\n# TYPE grpc_server_started_total counter\n");
        for m in &methods {
            let started = m.started.load(Ordering::Relaxed);
            if started > 0 {
                let _ = writeln!(
                    out,
                    "grpc_server_started_total{{grpc_service=\"{}\",grpc_method=\"{}\"}} {started}",
                    m.service, m.method
                );
            }
        }

        out.push_str("# HELP grpc_server_handled_total Total number of RPCs completed on the server, regardless of success or failure.\n# TYPE grpc_server_handled_total counter\n");
        for m in &methods {
            for (index, count) in m.handled.iter().enumerate() {
                let count = count.load(Ordering::Relaxed);
                if count > 0 {
                    let code = code_name(Code::from(index as i32));
                    let _ = writeln!(
                        out,
                        "grpc_server_handled_total{{grpc_service=\"{}\",grpc_method=\"{}\",grpc_code=\"{code}\"}} {count}",
                        m.service, m.method
                    );
                }
            }
        }

        out.push_str("# HELP grpc_server_handling_seconds Histogram of response latency (seconds) of gRPC calls, to the end of the stream.\n# TYPE grpc_server_handling_seconds histogram\n");
        for m in &methods {
            let counts: Vec<u64> = m
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect();
            let total: u64 = counts.iter().sum();
            if total == 0 {
                continue;
            }
            let labels = format!(
                "grpc_service=\"{}\",grpc_method=\"{}\"",
                m.service, m.method
            );
            let mut cumulative = 0;
            for (bound, count) in BUCKETS.iter().zip(&counts) {
                cumulative += count;
                let _ = writeln!(
                    out,
                    "grpc_server_handling_seconds_bucket{{{labels},le=\"{bound}\"}} {cumulative}"
                );
            }
            let _ = writeln!(
                out,
                "grpc_server_handling_seconds_bucket{{{labels},le=\"+Inf\"}} {total}"
            );
            let sum = m.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
            let _ = writeln!(out, "grpc_server_handling_seconds_sum{{{labels}}} {sum}");
            let _ = writeln!(
                out,
                "grpc_server_handling_seconds_count{{{labels}}} {total}"
            );
        }

        counter(
            &mut out,
            "sessionstore_exchanges_appended_total",
            "AppendExchange calls committed (idempotent replays not counted).",
            self.appended_exchanges.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "sessionstore_messages_appended_total",
            "Messages stored by AppendExchange.",
            self.appended_messages.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "sessionstore_watch_streams",
            "Open WatchSession streams.",
            self.watch_streams.load(Ordering::Relaxed),
        );
        if let Some(probe) = self.request_bytes.get() {
            gauge(
                &mut out,
                "sessionstore_request_bytes_in_flight",
                "Request bytes the server holds (counted as they arrive, or reserved from gRPC length prefixes).",
                probe() as u64,
            );
        }
        if let Some(probe) = self.stream_buffer.get() {
            gauge(
                &mut out,
                "sessionstore_stream_buffered_bytes",
                "Bytes read ahead by ExportHistory, ExportTranscript and WatchSession replays, \
                 reserved from --max-stream-buffer-bytes.",
                probe() as u64,
            );
        }
        if let Some(probe) = self.active_runs.get() {
            gauge(
                &mut out,
                "sessionstore_active_run_bytes",
                "Bytes the partial output of active runs holds for late joiners, \
                 bounded by --max-active-run-bytes.",
                probe() as u64,
            );
        }
        if let Some(probe) = self.pool.get() {
            let pool = probe();
            gauge(
                &mut out,
                "sessionstore_db_pool_connections",
                "Open database connections in the pool.",
                u64::from(pool.connections),
            );
            gauge(
                &mut out,
                "sessionstore_db_pool_idle_connections",
                "Idle database connections in the pool.",
                pool.idle as u64,
            );
            gauge(
                &mut out,
                "sessionstore_db_pool_max_connections",
                "The most connections the pool opens.",
                u64::from(pool.max),
            );
            if let Some(queued) = pool.queued_writes {
                gauge(
                    &mut out,
                    "sessionstore_db_queued_writes",
                    "Writes waiting for a writer task (SQLite: every write; PostgreSQL: appends).",
                    queued as u64,
                );
            }
            if let Some(batches) = pool.append_batches {
                render_batches(&mut out, &batches);
            }
        }
        if let Some(bytes) = resident_bytes() {
            gauge(
                &mut out,
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                bytes,
            );
        }
        out
    }
}

fn render_batches(out: &mut String, batches: &BatchFigures) {
    gauge(
        out,
        "sessionstore_append_writers",
        "PostgreSQL append writers on this replica (--append-writers).",
        batches.writers as u64,
    );
    gauge(
        out,
        "sessionstore_append_batches_in_flight",
        "PostgreSQL append batches being written now.",
        batches.in_flight,
    );
    counter(
        out,
        "sessionstore_append_batches_total",
        "PostgreSQL append batches tried (a batch redone counts again).",
        batches.batches,
    );
    counter(
        out,
        "sessionstore_append_batched_appends_total",
        "Appends in those batches.",
        batches.appends,
    );
    counter(
        out,
        "sessionstore_append_batch_round_trips_total",
        "Statements the append batches sent, BEGIN and COMMIT included.",
        batches.round_trips,
    );
    let name = "sessionstore_append_batch_busy_seconds_total";
    let _ = write!(
        out,
        "# HELP {name} Seconds the append writers spent in batches, summed over writers.\n\
         # TYPE {name} counter\n{name} {}\n",
        batches.busy_micros as f64 / 1e6
    );
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = write!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}\n"
    );
}

fn gauge(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = write!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n"
    );
}

/// The process's resident set, from `/proc/self/statm` (Linux only).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The upper-snake name of a code, as go-grpc-prometheus labels it
/// (`OK`, `NotFound`, …: the Go constant names).
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// Counts an open watch stream until dropped.
pub struct WatchStreamGauge(Arc<Metrics>);

impl Drop for WatchStreamGauge {
    fn drop(&mut self) {
        self.0.watch_streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The tower layer that measures every call.
#[derive(Clone)]
pub struct MetricsLayer(pub Arc<Metrics>);

impl<S> tower::Layer<S> for MetricsLayer {
    type Service = MetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MetricsService {
            inner,
            metrics: Arc::clone(&self.0),
        }
    }
}

/// See [`MetricsLayer`].
#[derive(Clone)]
pub struct MetricsService<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, ReqBody> tower::Service<http::Request<ReqBody>> for MetricsService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<MeteredBody>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let stats = Arc::clone(self.metrics.stats(request.uri().path()));
        stats.started.fetch_add(1, Ordering::Relaxed);
        let session = tracing::enabled!(target: RPC_LOG_TARGET, tracing::Level::DEBUG)
            .then(|| Arc::new(OnceLock::new()));
        let call = Call {
            stats,
            started: Instant::now(),
            done: false,
            session: session.clone(),
        };
        let future = self.inner.call(request);
        Box::pin(async move {
            let mut response = match session {
                Some(slot) => CALL_SESSION.scope(slot, future).await?,
                None => future.await?,
            };
            resource_exhausted_for_oversize(response.headers_mut());
            let (parts, body) = response.into_parts();
            let mut call = call;
            // A trailers-only response (every unary error) has its status
            // in the headers and an empty body.
            if let Some(code) = status_of(&parts.headers) {
                call.finish(code);
            }
            Ok(http::Response::from_parts(
                parts,
                MeteredBody {
                    inner: body,
                    call: Some(call),
                },
            ))
        })
    }
}

/// One call in flight: finished by its status, or `Cancelled` if dropped
/// before one was seen (the client went away).
struct Call {
    stats: Arc<MethodStats>,
    started: Instant,
    done: bool,
    /// The session the handler noted, when the call's log line is wanted.
    session: Option<Arc<OnceLock<String>>>,
}

impl Call {
    fn finish(&mut self, code: Code) {
        if !self.done {
            self.done = true;
            self.stats.finish(code, self.started);
            if let Some(session) = &self.session {
                tracing::debug!(
                    target: RPC_LOG_TARGET,
                    method = %format_args!("{}/{}", self.stats.service, self.stats.method),
                    session_id = session.get().map_or("", String::as_str),
                    code = ?code,
                    duration = ?self.started.elapsed(),
                    "rpc"
                );
            }
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.finish(Code::Cancelled);
    }
}

fn status_of(headers: &http::HeaderMap) -> Option<Code> {
    let value = headers.get("grpc-status")?.to_str().ok()?;
    Some(Code::from(value.parse::<i32>().ok()?))
}

/// tonic answers a request over `max_decoding_message_size` with
/// OUT_OF_RANGE; the API promises RESOURCE_EXHAUSTED, which is also what gRPC
/// itself uses for messages over the receive limit.
fn resource_exhausted_for_oversize(headers: &mut http::HeaderMap) {
    let oversize = headers.get("grpc-status").is_some_and(|s| s == "11")
        && headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .is_some_and(|m| m.contains("message%20length%20too%20large"));
    if oversize {
        headers.insert(
            "grpc-status",
            http::HeaderValue::from_static("8"), // RESOURCE_EXHAUSTED
        );
        headers.insert(
            "grpc-message",
            http::HeaderValue::from_static(
                "the request is larger than the server's --max-request-bytes",
            ),
        );
    }
}

/// A response body that records the call's status from its trailers.
pub struct MeteredBody {
    inner: tonic::body::Body,
    call: Option<Call>,
}

impl Body for MeteredBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(code) = frame.trailers_ref().and_then(status_of)
                    && let Some(mut call) = self.call.take()
                {
                    call.finish(code);
                }
            }
            Poll::Ready(Some(Err(status))) => {
                if let Some(mut call) = self.call.take() {
                    call.finish(status.code());
                }
            }
            Poll::Ready(None) => {
                if let Some(mut call) = self.call.take() {
                    // Ended without trailers: only trailers-only responses
                    // do, and those were counted from their headers.
                    call.done = true;
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `GET /metrics` on `listener` until the task is aborted.
pub async fn serve_http(listener: TcpListener, metrics: Arc<Metrics>) {
    use hyper::service::service_fn;
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "metrics listener cannot accept");
                continue;
            }
        };
        let metrics = Arc::clone(&metrics);
        tokio::spawn(async move {
            let service = service_fn(move |request: http::Request<hyper::body::Incoming>| {
                let metrics = Arc::clone(&metrics);
                async move { Ok::<_, Infallible>(answer(&request, &metrics)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            if let Err(error) = connection.await {
                tracing::debug!(%error, "metrics connection ended");
            }
        });
    }
}

fn answer<B>(
    request: &http::Request<B>,
    metrics: &Metrics,
) -> http::Response<http_body_util::Full<Bytes>> {
    let (status, content_type, body) =
        if request.method() == http::Method::GET && request.uri().path() == "/metrics" {
            (
                http::StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                metrics.render(),
            )
        } else {
            (
                http::StatusCode::NOT_FOUND,
                "text/plain; charset=utf-8",
                "only GET /metrics is served here\n".to_owned(),
            )
        };
    let mut response = http::Response::new(http_body_util::Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_come_from_the_descriptors_and_strangers_are_unknown() {
        let metrics = Metrics::new(&[sessionstore_client::FILE_DESCRIPTOR_SET]);
        let known = metrics.stats("/sessionstore.v1.SessionStore/AppendExchange");
        assert_eq!(known.method, "AppendExchange");
        assert_eq!(known.service, "sessionstore.v1.SessionStore");
        let stranger = metrics.stats("/sessionstore.v1.SessionStore/MadeUp");
        assert_eq!(stranger.service, "unknown");
        known.finish(Code::NotFound, Instant::now());
        let text = metrics.render();
        assert!(
            text.contains(
                "grpc_server_handled_total{grpc_service=\"sessionstore.v1.SessionStore\",grpc_method=\"AppendExchange\",grpc_code=\"NotFound\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("grpc_server_handling_seconds_count{grpc_service=\"sessionstore.v1.SessionStore\",grpc_method=\"AppendExchange\"} 1"));
    }
}
