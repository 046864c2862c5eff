//! Accepting HTTP(S) connections within a budget of file descriptors.
//!
//! Anyone who can reach the port can open connections, so their number is bounded (a share of the serve's
//! file descriptors; the rest stay for the socket, NVML and /proc) and none lingers: a connection must send
//! its request headers within `HEADER_TIMEOUT`, one request per connection. When every place is taken, a
//! new connection takes the place of the oldest one that has not sent a request yet, so connections that
//! send nothing cannot keep `/healthz` or a scrape out; only when every place serves a request is the new
//! one closed at once. Event streams, which stay open, may take half of the places (the rest are answered
//! 503 with `Retry-After`), so the other half is always there for short requests.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::task::AbortHandle;
use tokio_rustls::TlsAcceptor;

/// How long a connection may take to send its request headers (and a TLS client its handshake).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// A client that reads nothing of what it asked for (an event stream it never reads) for this long is let
/// go: what waits for it would otherwise stay in the serve's memory. The socket's peers get the same.
pub const WRITE_STALL: Duration = Duration::from_secs(30);

/// While more clients than this stall at once, each is let go after `WRITE_STALL_CROWDED`: what waits for
/// each (a many-host serve's reading, megabytes) adds up, and readers that read lose nothing by it.
pub const CROWDED: usize = 4;
pub const WRITE_STALL_CROWDED: Duration = Duration::from_secs(5);

/// Connections whose last write waits for their client now.
static STALLED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How long a stalled client is kept, with `stalled` clients stalled at once.
pub fn stall_limit(stalled: usize) -> Duration {
    if stalled > CROWDED {
        WRITE_STALL_CROWDED
    } else {
        WRITE_STALL
    }
}

/// How the serve's file descriptors are shared among what anyone can open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// HTTP connections open at once.
    pub http: usize,
    /// Of those, event streams (which stay open): half.
    pub streams: usize,
    /// Socket connections of unprivileged users together.
    pub socket: usize,
}

impl Budget {
    /// A quarter of the descriptor limit each for HTTP and unprivileged socket peers (the socket's at most
    /// 512); the other half stays for NVML, /proc, pidfds and root's own socket connections.
    pub fn of(fd_limit: u64) -> Budget {
        let quarter = usize::try_from(fd_limit / 4).unwrap_or(usize::MAX).max(16);
        let http = quarter.min(65_536);
        Budget {
            http,
            streams: http / 2,
            socket: quarter.min(512),
        }
    }
}

/// One open connection: whether it has sent a request, and how to close it.
struct Open {
    id: u64,
    asked: Arc<AtomicBool>,
    task: AbortHandle,
}

/// The open connections, oldest first.
struct Conns {
    cap: usize,
    open: Mutex<VecDeque<Open>>,
    next: AtomicU64,
}

impl Conns {
    /// Room for one more: a place free, or the oldest connection that has not asked for anything closed.
    /// False when every place serves a request.
    fn make_room(&self) -> bool {
        let Ok(mut open) = self.open.lock() else {
            return false;
        };
        open.retain(|c| !c.task.is_finished());
        if open.len() < self.cap {
            return true;
        }
        match open.iter().position(|c| !c.asked.load(Ordering::Relaxed)) {
            Some(i) => {
                if let Some(c) = open.remove(i) {
                    c.task.abort();
                }
                true
            }
            None => false,
        }
    }

    fn add(&self, id: u64, asked: Arc<AtomicBool>, task: AbortHandle) {
        if let Ok(mut open) = self.open.lock() {
            open.push_back(Open { id, asked, task });
        }
    }

    fn remove(&self, id: u64) {
        if let Ok(mut open) = self.open.lock() {
            open.retain(|c| c.id != id);
        }
    }
}

/// The router as hyper calls it, noting that the connection asked for something.
#[derive(Clone)]
struct Marked {
    inner: TowerToHyperService<axum::Router>,
    asked: Arc<AtomicBool>,
}

impl hyper::service::Service<hyper::Request<Incoming>> for Marked {
    type Response = <TowerToHyperService<axum::Router> as hyper::service::Service<
        hyper::Request<Incoming>,
    >>::Response;
    type Error = <TowerToHyperService<axum::Router> as hyper::service::Service<
        hyper::Request<Incoming>,
    >>::Error;
    type Future = <TowerToHyperService<axum::Router> as hyper::service::Service<
        hyper::Request<Incoming>,
    >>::Future;

    fn call(&self, req: hyper::Request<Incoming>) -> Self::Future {
        self.asked.store(true, Ordering::Relaxed);
        self.inner.call(req)
    }
}

/// Serve HTTP, or HTTPS with `tls`, on `listener` until the serve ends.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: axum::Router,
    budget: Budget,
) {
    let conns = Arc::new(Conns {
        cap: budget.http.max(1),
        open: Mutex::new(VecDeque::new()),
        next: AtomicU64::new(0),
    });
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            // Out of descriptors, most likely: give what holds them a moment to go.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        if !conns.make_room() {
            drop(tcp);
            continue;
        }
        let id = conns.next.fetch_add(1, Ordering::Relaxed);
        let asked = Arc::new(AtomicBool::new(false));
        let svc = Marked {
            inner: TowerToHyperService::new(router.clone()),
            asked: asked.clone(),
        };
        let tls = tls.clone();
        let mine = conns.clone();
        let task = tokio::spawn(async move {
            match tls {
                Some(acceptor) => {
                    if let Ok(Ok(stream)) =
                        tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(tcp)).await
                    {
                        one(stream, svc).await;
                    }
                }
                None => one(tcp, svc).await,
            }
            mine.remove(id);
        });
        conns.add(id, asked, task.abort_handle());
    }
}

/// One connection: one request, its headers within `HEADER_TIMEOUT`, and a client that takes nothing of the
/// answer for `WRITE_STALL` let go.
async fn one<I: AsyncRead + AsyncWrite + Unpin + Send + 'static>(io: I, svc: Marked) {
    let stalled = Arc::new(Mutex::new(None));
    let io = Watched {
        inner: io,
        stalled: stalled.clone(),
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(false)
        .serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let mut check = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = &mut conn => return,
            _ = check.tick() => {
                let since = stalled.lock().ok().and_then(|s| *s);
                let limit = stall_limit(STALLED.load(std::sync::atomic::Ordering::Relaxed));
                if since.is_some_and(|t: std::time::Instant| t.elapsed() >= limit) {
                    return;
                }
            }
        }
    }
}

/// A connection's stream, noting since when a write has been waiting for the client to read.
struct Watched<I> {
    inner: I,
    stalled: Arc<Mutex<Option<std::time::Instant>>>,
}

impl<I> Watched<I> {
    fn note(&self, pending: bool) {
        use std::sync::atomic::Ordering;
        if let Ok(mut s) = self.stalled.lock() {
            match (pending, s.is_some()) {
                (true, false) => {
                    *s = Some(std::time::Instant::now());
                    STALLED.fetch_add(1, Ordering::Relaxed);
                }
                (false, true) => {
                    *s = None;
                    STALLED.fetch_sub(1, Ordering::Relaxed);
                }
                _ => {}
            }
        }
    }
}

impl<I> Drop for Watched<I> {
    fn drop(&mut self) {
        // A connection let go (or ended) while stalled is stalled no more.
        if self.stalled.lock().is_ok_and(|s| s.is_some()) {
            STALLED.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note(r.is_pending());
        r
    }
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note(r.is_pending());
        r
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_flush(cx);
        self.note(r.is_pending());
        r
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarter_of_the_descriptors_each_and_the_socket_at_most_512() {
        assert_eq!(
            Budget::of(1024),
            Budget {
                http: 256,
                streams: 128,
                socket: 256
            }
        );
        assert_eq!(
            Budget::of(1_048_576),
            Budget {
                http: 65_536,
                streams: 32_768,
                socket: 512
            }
        );
        assert_eq!(Budget::of(0).http, 16);
    }
}
