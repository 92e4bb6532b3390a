//! A TCP proxy for the clients' retry tests: it cuts a connection just
//! before the server's next response (or all of them), so a call whose
//! work is done loses its answer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// A TCP proxy in front of a server that can cut connections: each one
/// just before the server's next response starts, or all at once. It
/// reads the server's HTTP/2 frames, so it knows when a response begins
/// (the first HEADERS frame of a stream), which the server sends only
/// after the call's work — a commit, for an append — is done.
pub struct Proxy {
    addr: SocketAddr,
    cut_next_response: Arc<AtomicBool>,
    responses_cut: Arc<AtomicUsize>,
    cut_all: tokio::sync::watch::Sender<u64>,
    accepted: tokio::sync::watch::Receiver<usize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut_next_response = Arc::new(AtomicBool::new(false));
        let responses_cut = Arc::new(AtomicUsize::new(0));
        let (cut_all, cut_all_rx) = tokio::sync::watch::channel(0_u64);
        let (accepted_tx, accepted) = tokio::sync::watch::channel(0_usize);
        let arm = Arc::clone(&cut_next_response);
        let cut = Arc::clone(&responses_cut);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                accepted_tx.send_modify(|n| *n += 1);
                tokio::spawn(pipe(
                    client,
                    upstream,
                    Arc::clone(&arm),
                    Arc::clone(&cut),
                    cut_all_rx.clone(),
                ));
            }
        });
        Proxy {
            addr,
            cut_next_response,
            responses_cut,
            cut_all,
            accepted,
            task,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next response to start on any connection is not forwarded:
    /// its connection is closed instead.
    pub fn cut_before_next_response(&self) {
        self.cut_next_response.store(true, Ordering::SeqCst);
    }

    /// Closes every open connection.
    pub fn cut_all(&self) {
        self.cut_all.send_modify(|generation| *generation += 1);
    }

    pub fn responses_cut(&self) -> usize {
        self.responses_cut.load(Ordering::SeqCst)
    }

    pub fn accepted(&self) -> usize {
        *self.accepted.borrow()
    }

    /// Waits until the proxy has accepted `count` connections in all.
    pub async fn await_accepted(&self, count: usize) {
        let mut accepted = self.accepted.clone();
        tokio::time::timeout(Duration::from_secs(30), accepted.wait_for(|n| *n >= count))
            .await
            .expect("the client connects within the timeout")
            .unwrap();
    }
}

/// Forwards one connection; stops (closing both sides) when told to cut.
async fn pipe(
    client: TcpStream,
    upstream: SocketAddr,
    cut_next_response: Arc<AtomicBool>,
    responses_cut: Arc<AtomicUsize>,
    mut cut_all: tokio::sync::watch::Receiver<u64>,
) {
    // Only cuts ordered from now on apply to this connection.
    cut_all.borrow_and_update();
    // A server that is down: the client sees its connection closed.
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = tokio::io::copy(&mut client_read, &mut server_write);
    let down = async {
        let mut header = [0_u8; 9];
        loop {
            server_read.read_exact(&mut header).await?;
            let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
            let kind = header[3];
            let stream =
                u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & !(1 << 31);
            let mut payload = vec![0_u8; length];
            server_read.read_exact(&mut payload).await?;
            const HEADERS: u8 = 0x1;
            if kind == HEADERS && stream != 0 && cut_next_response.swap(false, Ordering::SeqCst) {
                responses_cut.fetch_add(1, Ordering::SeqCst);
                return Ok::<(), std::io::Error>(());
            }
            client_write.write_all(&header).await?;
            client_write.write_all(&payload).await?;
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = cut_all.changed() => {}
    }
    // Dropping the halves closes both connections.
}
