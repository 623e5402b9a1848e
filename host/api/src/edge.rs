//! The HTTP edge: this node's own accept loop, so abuse costs bounded
//! resources.
//!
//! Rules, and why:
//! - **A bound on connections, refused fast.** Past `max_connections`
//!   accepted sockets, a new one is answered a canned 503 with
//!   `Retry-After` and closed at once: a sender retries against a peer
//!   instead of waiting on a socket that will never be served, and idle
//!   sockets cannot eat the descriptors the node needs for itself (the
//!   broker's restart, SQLite, MCP children). Connections already admitted
//!   keep being served; an upgraded socket (`/ws/stream`) keeps its place
//!   until it closes.
//! - **Headers and bodies arrive in time or not at all.** A request's
//!   headers must be complete within `header_timeout` of the moment the
//!   connection starts waiting for them — a fresh socket, or a kept-alive
//!   one between requests — and the socket is closed otherwise (slow-loris,
//!   idle sockets hoarding the cap); its body within
//!   `body_timeout` of the request's start (the handler's read fails, and
//!   the request is answered 400 without being acted on).
//! - **Refusals are paced per connection.** A connection may draw
//!   [`RefusalPace::burst`] refusals (any 4xx or 5xx answer) at once, then
//!   [`RefusalPace::per_second`]; past that, each refusal is written only
//!   when its token is due (at most a second late). A keep-alive client
//!   that ignores `Retry-After` and hammers a quarantined route, an
//!   unserved one or a bad signature gets what it asked for at the pace a
//!   sender that honours refusals would, so its requests cannot crowd out
//!   the connections that are being served; a refusal is never dropped.
//! - **Graceful stop.** On shutdown the listener closes, every connection
//!   finishes the request in flight and then closes; the call returns once
//!   all have.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tracing::{debug, warn};

/// How the edge bounds what a client can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub refusals: RefusalPace,
}

impl Default for EdgeLimits {
    fn default() -> Self {
        EdgeLimits {
            max_connections: 512,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            refusals: RefusalPace::default(),
        }
    }
}

/// How many refusals one connection draws before they are paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefusalPace {
    pub burst: u32,
    pub per_second: u32,
}

impl Default for RefusalPace {
    fn default() -> Self {
        RefusalPace {
            burst: 32,
            per_second: 16,
        }
    }
}

/// The longest a paced refusal waits.
const MAX_PACE: Duration = Duration::from_secs(1);

/// One connection's refusal tokens.
struct Refusals {
    pace: RefusalPace,
    tokens: f64,
    last: std::time::Instant,
}

impl Refusals {
    fn new(pace: RefusalPace) -> Refusals {
        Refusals {
            pace,
            tokens: f64::from(pace.burst),
            last: std::time::Instant::now(),
        }
    }

    /// Draws a token for one refusal; answers how long it must wait.
    fn draw(&mut self, now: std::time::Instant) -> Duration {
        let rate = f64::from(self.pace.per_second.max(1));
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * rate).min(f64::from(self.pace.burst));
        // Owing more than the longest wait's worth would only lengthen
        // waits past it: the debt is capped with the wait.
        self.tokens = (self.tokens - 1.0).max(-rate * MAX_PACE.as_secs_f64());
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / rate).min(MAX_PACE)
        }
    }
}

/// The body of the canned answer for a connection past the cap, written
/// without reading the request, so refusing costs one write.
const OVER_CAPACITY: &str = r#"{"status":"unavailable","error":"over_capacity","detail":"this node holds as many connections as it serves; retry in a second or against a peer"}"#;

fn over_capacity() -> String {
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{OVER_CAPACITY}",
        OVER_CAPACITY.len()
    )
}

/// Serves `router` on `listener` under `limits` until `shutdown` resolves,
/// then finishes the requests in flight.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: EdgeLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (closing_tx, closing) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors (or another transient accept
                    // failure): it clears only as sockets close, so pause
                    // accepting for a moment instead of spinning on it.
                    warn!(subsystem = "api", error = %e, "accept failed; pausing accepts for 100 ms");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                conns.spawn(connection(
                    stream,
                    peer,
                    router.clone(),
                    limits,
                    closing.clone(),
                    permit,
                ));
            }
            Err(_) => {
                conns.spawn(refuse(stream));
            }
        }
    }
    drop(listener);
    let _ = closing_tx.send(true);
    while conns.join_next().await.is_some() {}
    Ok(())
}

async fn refuse(mut stream: TcpStream) {
    let written = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(over_capacity().as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
    debug!(
        subsystem = "api",
        ?written,
        "connection past the cap refused"
    );
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    limits: EdgeLimits,
    mut closing: watch::Receiver<bool>,
    permit: OwnedSemaphorePermit,
) {
    let slot = ConnectionSlot(Arc::new(permit));
    let refusals = Arc::new(std::sync::Mutex::new(Refusals::new(limits.refusals)));
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let mut req =
            req.map(|body| axum::body::Body::new(Deadline::new(body, limits.body_timeout)));
        req.extensions_mut().insert(ConnectInfo(peer));
        req.extensions_mut().insert(slot.clone());
        let answer = tower::ServiceExt::oneshot(router.clone(), req);
        let refusals = refusals.clone();
        async move {
            let response = answer.await?;
            let status = response.status();
            if status.is_client_error() || status.is_server_error() {
                let wait = refusals
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .draw(std::time::Instant::now());
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
            }
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let conn = builder
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    let mut conn = std::pin::pin!(conn);
    let ended = tokio::select! {
        r = conn.as_mut() => r,
        _ = async { closing.wait_for(|c| *c).await.map(|_| ()) } => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = ended {
        debug!(subsystem = "api", %peer, error = %e, "connection ended with an error");
    }
}

/// A connection's place under the cap, in every request's extensions so
/// that an upgraded socket (`/ws/stream`) keeps it after its HTTP
/// connection has ended.
#[derive(Clone)]
pub(crate) struct ConnectionSlot(#[allow(dead_code)] Arc<OwnedSemaphorePermit>);

/// A request body that must arrive whole within its deadline.
struct Deadline {
    inner: Incoming,
    limit: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl Deadline {
    fn new(inner: Incoming, limit: Duration) -> Deadline {
        Deadline {
            inner,
            limit,
            sleep: Box::pin(tokio::time::sleep(limit)),
        }
    }
}

/// The body did not arrive within the edge's `body_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?} (api.body_timeout_seconds); send it at once")]
pub struct BodyTimedOut(Duration);

impl hyper::body::Body for Deadline {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut(self.limit))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::put;
    use tokio::io::AsyncReadExt;

    async fn started(limits: EdgeLimits) -> (SocketAddr, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route(
            "/echo",
            put(|body: Bytes| async move { format!("got {}", body.len()) }),
        );
        let (stop, mut stopped) = watch::channel(false);
        tokio::spawn(serve(listener, app, limits, async move {
            let _ = stopped.wait_for(|s| *s).await;
        }));
        (addr, stop)
    }

    async fn answer(s: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn a_body_that_does_not_arrive_in_time_is_refused_and_a_prompt_one_is_served() {
        let limits = EdgeLimits {
            body_timeout: Duration::from_millis(300),
            ..EdgeLimits::default()
        };
        let (addr, _stop) = started(limits).await;
        let head =
            "PUT /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 10\r\n\r\n";

        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(head.as_bytes()).await.unwrap();
        slow.write_all(b"a").await.unwrap();
        let t0 = std::time::Instant::now();
        let got = answer(&mut slow).await;
        assert!(got.starts_with("HTTP/1.1 400"), "{got}");
        assert!(got.contains("did not arrive within"), "{got}");
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());

        let mut prompt = TcpStream::connect(addr).await.unwrap();
        prompt.write_all(head.as_bytes()).await.unwrap();
        prompt.write_all(b"0123456789").await.unwrap();
        let got = answer(&mut prompt).await;
        assert!(
            got.starts_with("HTTP/1.1 200") && got.ends_with("got 10"),
            "{got}"
        );
    }

    #[tokio::test]
    async fn a_socket_that_sends_nothing_is_closed_after_the_header_timeout() {
        let limits = EdgeLimits {
            header_timeout: Duration::from_millis(300),
            ..EdgeLimits::default()
        };
        let (addr, _stop) = started(limits).await;
        let mut idle = TcpStream::connect(addr).await.unwrap();
        let t0 = std::time::Instant::now();
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "closed, not answered: {read:?}"
        );
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(3),
            "{took:?}"
        );
    }

    #[test]
    fn a_connection_draws_its_burst_then_refusals_at_the_pace() {
        let pace = RefusalPace {
            burst: 3,
            per_second: 10,
        };
        let mut r = Refusals::new(pace);
        let t0 = r.last;
        for _ in 0..3 {
            assert_eq!(r.draw(t0), Duration::ZERO);
        }
        assert_eq!(r.draw(t0), Duration::from_millis(100));
        assert_eq!(r.draw(t0), Duration::from_millis(200));
        // Half a second later the debt is paid and two tokens are back.
        let later = t0 + Duration::from_millis(500);
        assert_eq!(r.draw(later), Duration::ZERO);
        assert_eq!(r.draw(later), Duration::ZERO);
        assert_eq!(r.draw(later), Duration::ZERO);
        // However long the hammering, no refusal waits past the cap.
        for _ in 0..1000 {
            assert!(r.draw(later) <= MAX_PACE);
        }
        assert_eq!(r.draw(later), MAX_PACE);
    }

    #[tokio::test]
    async fn refusals_past_the_burst_are_paced_and_answers_are_not() {
        let limits = EdgeLimits {
            refusals: RefusalPace {
                burst: 4,
                per_second: 20,
            },
            ..EdgeLimits::default()
        };
        let (addr, _stop) = started(limits).await;
        let mut conn = TcpStream::connect(addr).await.unwrap();
        let mut exchange = async |path: &str| {
            let head = format!("PUT {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
            conn.write_all(head.as_bytes()).await.unwrap();
            let mut buf = [0u8; 512];
            let n = conn.read(&mut buf).await.unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        };
        let t0 = std::time::Instant::now();
        for _ in 0..4 {
            assert!(exchange("/nowhere").await.starts_with("HTTP/1.1 404"));
        }
        assert!(
            t0.elapsed() < Duration::from_millis(150),
            "{:?}",
            t0.elapsed()
        );
        for _ in 0..10 {
            assert!(exchange("/echo").await.starts_with("HTTP/1.1 200"));
        }
        assert!(
            t0.elapsed() < Duration::from_millis(300),
            "{:?}",
            t0.elapsed()
        );
        // Twelve more refusals: whatever refilled meanwhile, at most the
        // burst of four is free, so the other eight take 20 a second.
        let t1 = std::time::Instant::now();
        for _ in 0..12 {
            assert!(exchange("/nowhere").await.starts_with("HTTP/1.1 404"));
        }
        assert!(
            t1.elapsed() >= Duration::from_millis(350),
            "{:?}",
            t1.elapsed()
        );
    }

    #[tokio::test]
    async fn past_the_cap_the_canned_answer_is_a_well_formed_503() {
        let limits = EdgeLimits {
            max_connections: 1,
            ..EdgeLimits::default()
        };
        let (addr, stop) = started(limits).await;
        let _held = TcpStream::connect(addr).await.unwrap();
        // The held socket takes the one permit once accepted; a later
        // connection is queued behind it in the kernel, so it is refused.
        let mut refused = None;
        for _ in 0..50 {
            let mut next = TcpStream::connect(addr).await.unwrap();
            let got = answer(&mut next).await;
            if got.starts_with("HTTP/1.1 503") {
                refused = Some(got);
                break;
            }
        }
        let got = refused.expect("a 503 past the cap");
        let (head, body) = got.split_once("\r\n\r\n").unwrap();
        assert!(head.contains("Retry-After: 1"), "{head}");
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{got}"
        );
        let parsed: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(parsed["error"], "over_capacity");
        let _ = stop.send(true);
    }
}
