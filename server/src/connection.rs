//! Accepted gRPC connections whose writes are coalesced.
//!
//! h2 hands the socket every DATA frame over 256 bytes as its own vectored
//! write, and flushes before it buffers the next one: one `writev` per
//! frame. A watched session's event goes to every watcher as its own frame,
//! so an append with 1,000 watchers cost 1,000 system calls (and on
//! loopback as many trips through the receiver's TCP stack); `perf` put
//! ~40% of the server's time there. [`Coalesced`] takes h2's writes into a
//! buffer instead and lets a task per connection write that buffer to the
//! socket: the frames a connection produces in one poll leave in one
//! `write`.
//!
//! - **Order.** Bytes reach the socket in the order they were written.
//! - **Backpressure.** Once [`MAX_BUFFERED`] bytes wait, writes return
//!   `Pending` until the writer task has taken them.
//! - **Flush** returns once bytes are in the buffer: the writer task is
//!   already woken, as a kernel send buffer would be. A failed socket write
//!   is reported to the next write, flush or shutdown.
//! - **Shutdown** waits until the buffer is written, then shuts the
//!   socket's write half. A connection dropped without one still gets what
//!   it buffered written, for at most [`LINGER`].
//! - **Memory.** An idle connection holds no buffer: each write burst is
//!   handed to the writer task whole and freed once written. A new
//!   buffer is allocated with the size of the largest burst so far (up to
//!   twice [`MAX_BUFFERED`]), or of its first write if that is larger, so
//!   that a burst of watch events is not copied again and again as it
//!   grows, nor an export's chunk once it is past that size.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::Notify;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Bytes a connection may have waiting for its writer task before writes
/// wait.
pub const MAX_BUFFERED: usize = 256 * 1024;

/// How long a connection dropped without a shutdown may still take to
/// write what it buffered.
pub const LINGER: Duration = Duration::from_secs(5);

/// A TCP connection whose writes are buffered and written by a task of
/// its own. See the module documentation.
pub struct Coalesced {
    read: OwnedReadHalf,
    shared: Arc<Shared>,
    info: TcpConnectInfo,
}

struct Shared {
    state: Mutex<State>,
    /// Bytes are waiting, or the connection is closing.
    ready: Notify,
}

#[derive(Default)]
struct State {
    buffer: Vec<u8>,
    /// Room a new buffer starts with: the largest burst so far, so that a
    /// burst is not copied again and again as it grows.
    room: usize,
    /// Set by shutdown or drop: write what is buffered, then stop.
    closing: bool,
    /// Dropped: the writer task gives up on a write after [`LINGER`].
    dropped: bool,
    /// The writer task shut the write half down (or failed).
    finished: bool,
    /// The socket write that failed; every later call reports it.
    failed: Option<io::ErrorKind>,
    /// A write waiting for room in the buffer.
    blocked: Option<Waker>,
    /// A shutdown waiting for the writer task to finish.
    shutting_down: Option<Waker>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Coalesced {
    /// Splits `stream` and spawns its writer task on the current runtime.
    pub fn new(stream: TcpStream) -> Self {
        let info = stream.connect_info();
        let (read, write) = stream.into_split();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            ready: Notify::new(),
        });
        tokio::spawn(write_out(Arc::clone(&shared), write));
        Self { read, shared, info }
    }

    fn buffer(&self, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let mut state = self.shared.state();
        if let Some(kind) = state.failed {
            return Poll::Ready(Err(kind.into()));
        }
        if state.closing {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if state.buffer.len() >= MAX_BUFFERED {
            state.blocked = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let was_empty = state.buffer.is_empty();
        // Room for the whole write before any of it is copied: h2 hands over
        // a DATA frame in one write, an export's whole 1 MiB chunk to a
        // client that takes frames that large (gRPC's C core does), and a
        // buffer grown slice by slice past its first reservation was
        // reallocated, copying what it held, for every chunk.
        let incoming: usize = bufs.iter().map(|buf| buf.len()).sum();
        if state.buffer.capacity() == 0 {
            // A burst can pass the limit by the write that reached it.
            let room = state.room.min(2 * MAX_BUFFERED);
            state.buffer.reserve(room.max(incoming));
        } else {
            state.buffer.reserve(incoming);
        }
        let mut written = 0;
        for buf in bufs {
            state.buffer.extend_from_slice(buf);
            written += buf.len();
        }
        drop(state);
        if was_empty && written > 0 {
            self.shared.ready.notify_one();
        }
        Poll::Ready(Ok(written))
    }
}

/// The connection's writer task: writes each burst of buffered bytes with
/// one `write_all`, until the connection closes or a write fails.
async fn write_out(shared: Arc<Shared>, mut socket: OwnedWriteHalf) {
    loop {
        // Let the tasks that are ready run first: hyper sends each stream's
        // frames from a task of its own, and those woken by the same event
        // add theirs to this burst.
        tokio::task::yield_now().await;
        let burst = {
            let mut state = shared.state();
            if state.buffer.is_empty() && state.closing {
                break;
            }
            let burst = std::mem::take(&mut state.buffer);
            state.room = state.room.max(burst.len());
            if let Some(waker) = state.blocked.take() {
                waker.wake();
            }
            burst
        };
        if burst.is_empty() {
            shared.ready.notified().await;
            continue;
        }
        let write = socket.write_all(&burst);
        tokio::pin!(write);
        let written = tokio::select! {
            written = &mut write => written,
            // Dropped (maybe while the peer is not reading): the same write
            // goes on, for at most LINGER.
            () = dropped_signal(&shared) => tokio::time::timeout(LINGER, &mut write)
                .await
                .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into())),
        };
        if let Err(error) = written {
            tracing::debug!(%error, "connection write failed");
            finish(&shared, Some(error.kind()));
            return;
        }
    }
    let shut = socket.shutdown().await;
    finish(&shared, shut.err().map(|error| error.kind()));
}

/// Completes once the connection has been dropped.
async fn dropped_signal(shared: &Shared) {
    loop {
        let notified = shared.ready.notified();
        if shared.state().dropped {
            return;
        }
        notified.await;
    }
}

fn finish(shared: &Shared, failed: Option<io::ErrorKind>) {
    let mut state = shared.state();
    state.finished = true;
    if state.failed.is_none() {
        state.failed = failed;
    }
    state.buffer = Vec::new();
    for waker in [state.blocked.take(), state.shutting_down.take()]
        .into_iter()
        .flatten()
    {
        waker.wake();
    }
}

impl Drop for Coalesced {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        state.closing = true;
        state.dropped = true;
        drop(state);
        self.shared.ready.notify_waiters();
        self.shared.ready.notify_one();
    }
}

impl Connected for Coalesced {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for Coalesced {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.read).poll_read(cx, buf)
    }
}

impl AsyncWrite for Coalesced {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.buffer(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.buffer(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.shared.state().failed {
            Some(kind) => Poll::Ready(Err(kind.into())),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut state = self.shared.state();
        if state.finished {
            return Poll::Ready(match state.failed {
                Some(kind) => Err(kind.into()),
                None => Ok(()),
            });
        }
        state.shutting_down = Some(cx.waker().clone());
        let first = !state.closing;
        state.closing = true;
        drop(state);
        if first {
            self.shared.ready.notify_one();
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// A connected pair: the accepted end wrapped in [`Coalesced`], and the
    /// client end.
    async fn pair() -> io::Result<(Coalesced, TcpStream)> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let client = TcpStream::connect(listener.local_addr()?).await?;
        let (accepted, _) = listener.accept().await?;
        Ok((Coalesced::new(accepted), client))
    }

    /// 4 MiB in writes of varied sizes, as h2 would make them.
    fn payload() -> Vec<Vec<u8>> {
        (0..4096u32)
            .map(|i| {
                let len = 1 + (i as usize * 7919) % 2047;
                (0..len).map(|j| (i as usize + j) as u8).collect()
            })
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bytes_arrive_in_order_with_bounded_buffering_and_shutdown_ends_the_stream()
    -> io::Result<()> {
        let (mut server, mut client) = pair().await?;
        let chunks = payload();
        let expected: Vec<u8> = chunks.concat();
        let shared = Arc::clone(&server.shared);
        let writer = tokio::spawn(async move {
            let mut most = 0;
            for chunk in &chunks {
                server.write_all(chunk).await?;
                server.flush().await?;
                most = most.max(shared.state().buffer.len());
            }
            server.shutdown().await?;
            Ok::<_, io::Error>(most)
        });
        // The writer outpaces the client; the buffer must stay bounded.
        let mut received = Vec::new();
        client.read_to_end(&mut received).await?;
        let most = writer.await.map_err(io::Error::other)??;
        assert!(received == expected, "bytes differ or are out of order");
        assert!(
            most < MAX_BUFFERED + 2048,
            "buffered {most} bytes, more than the {MAX_BUFFERED} limit allows"
        );
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_connection_still_writes_what_it_buffered() -> io::Result<()> {
        let (mut server, mut client) = pair().await?;
        let expected: Vec<u8> = payload().concat()[..200_000].to_vec();
        server.write_all(&expected).await?;
        drop(server);
        let mut received = Vec::new();
        client.read_to_end(&mut received).await?;
        assert!(received == expected, "the buffered bytes were lost");
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_pass_through_and_connect_info_names_the_peer() -> io::Result<()> {
        let (mut server, mut client) = pair().await?;
        assert_eq!(server.connect_info().remote_addr, client.local_addr().ok());
        client.write_all(b"ping").await?;
        let mut read = [0u8; 4];
        server.read_exact(&mut read).await?;
        assert_eq!(&read, b"ping");
        Ok(())
    }
}
