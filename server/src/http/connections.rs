//! Connections: how long a client may take to send a request and how many it may hold open.
//! Without these, idle or half-sent sockets from anyone who can reach the port pile up until the
//! process runs out of file descriptors and answers nothing, health checks included.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;
use tower_http::timeout::TimeoutBody;

/// File descriptors kept free of connections: database connections, bill files, exports.
const DESCRIPTORS_KEPT_FREE: u64 = 256;
/// How often the "connection cap reached" line may repeat while the cap holds.
const CAP_LOG_EVERY: Duration = Duration::from_secs(60);

/// What one client may hold. Defaults suit a server behind a load balancer or reached directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// A request's head (request line and headers) must arrive within this of the connection
    /// opening or of the previous answer on it; a connection idle this long is closed.
    pub header_read: Duration,
    /// A request body that sends nothing for this long is dropped and its connection closed.
    pub body_idle: Duration,
    /// Connections open at once; further clients wait in the kernel's queue until one closes.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_read: Duration::from_secs(30),
            body_idle: Duration::from_secs(30),
            max_connections: 4_096,
        }
    }
}

impl ConnectionLimits {
    /// The cap this process can keep: the configured one, or fewer when the open-file limit
    /// (raised to its hard limit first) would run out before it. Says so in the log.
    pub fn within_open_file_limit(self) -> Self {
        let Some(open_files) = raise_open_file_limit() else {
            return self;
        };
        let fits = open_files.saturating_sub(DESCRIPTORS_KEPT_FREE).max(1);
        if (self.max_connections as u64) <= fits {
            return self;
        }
        tracing::warn!(
            configured = self.max_connections,
            open_file_limit = open_files,
            cap = fits,
            "the open-file limit holds fewer connections than GPULEDGER_MAX_CONNECTIONS; \
             capping connections at {fits} (raise LimitNOFILE to allow more)"
        );
        ConnectionLimits {
            max_connections: fits as usize,
            ..self
        }
    }
}

/// Raises this process's soft open-file limit to its hard limit and answers the soft limit now
/// in force; `None` where the platform has no such limit.
fn raise_open_file_limit() -> Option<u64> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => Some(limit),
        Err(error) => {
            tracing::warn!(%error, "cannot read or raise the open-file limit");
            rlimit::getrlimit(rlimit::Resource::NOFILE)
                .ok()
                .map(|(soft, _)| soft)
        }
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then finishes the requests in flight.
/// Each request carries its peer's address ([`ConnectInfo`]) for counting sign-ins per client.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    // HTTP/1.1 only: HTTP/2 ends at the load balancer, and its clear-text form would first wait,
    // with no timeout of its own, for a preface that decides which protocol a client speaks.
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read);
    let graceful = GracefulShutdown::new();
    let mut last_cap_log: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if last_cap_log.is_none_or(|at| at.elapsed() >= CAP_LOG_EVERY) {
                    tracing::warn!(
                        cap = limits.max_connections,
                        "connection cap reached: {} connections are open; new ones wait until \
                         one closes (GPULEDGER_MAX_CONNECTIONS)",
                        limits.max_connections
                    );
                    last_cap_log = Some(Instant::now());
                }
                tokio::select! {
                    slot = slots.clone().acquire_owned() => match slot {
                        Ok(slot) => slot,
                        Err(_) => break,
                    },
                    () = &mut shutdown => break,
                }
            }
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors or a connection reset before it was taken: not the
                    // listener's fault, so wait a moment rather than spin, and go on.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let body_idle = limits.body_idle;
        let service =
            app.clone()
                .map_request(move |request: axum::http::Request<hyper::body::Incoming>| {
                    let mut request = request.map(|body| TimeoutBody::new(body_idle, body));
                    request
                        .extensions_mut()
                        .insert(ConnectInfo::<SocketAddr>(peer));
                    request
                });
        let connection =
            builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            // A client that went away or broke its request is its own business.
            if let Err(error) = connection.await {
                tracing::debug!(%peer, %error, "connection ended");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::{get, post};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// A health check that also says whose address it saw, and an upload that reads its body.
    fn app() -> Router {
        Router::new()
            .route(
                "/healthz",
                get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move {
                    peer.ip().to_string()
                }),
            )
            .route(
                "/upload",
                post(|body: String| async move { body.len().to_string() }),
            )
    }

    async fn start(limits: ConnectionLimits) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, app(), limits, std::future::pending()));
        addr
    }

    async fn health(addr: SocketAddr) -> String {
        let answer = reqwest::Client::new()
            .get(format!("http://{addr}/healthz"))
            .timeout(Duration::from_secs(20))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        answer.text().await.unwrap()
    }

    /// Reads until the server closes the connection, and what it answered before closing.
    async fn closed_by_server(mut stream: TcpStream) -> String {
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut answer))
            .await
            .expect("the server closed the connection")
            .ok();
        String::from_utf8_lossy(&answer).into_owned()
    }

    #[tokio::test]
    async fn idle_and_half_sent_connections_are_closed_while_health_checks_answer() {
        let addr = start(ConnectionLimits {
            header_read: Duration::from_millis(300),
            body_idle: Duration::from_millis(300),
            max_connections: 4,
        })
        .await;
        // Twice the cap in sockets that send nothing, one stopped inside its headers and one
        // inside its body: what a slow-loris client holds.
        let mut stalled = Vec::new();
        for _ in 0..8 {
            stalled.push(TcpStream::connect(addr).await.unwrap());
        }
        let mut half_head = TcpStream::connect(addr).await.unwrap();
        half_head
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: gpuledger\r\n")
            .await
            .unwrap();
        let mut half_body = TcpStream::connect(addr).await.unwrap();
        half_body
            .write_all(
                b"POST /upload HTTP/1.1\r\nHost: gpuledger\r\nContent-Length: 100\r\n\r\n0123456789",
            )
            .await
            .unwrap();

        assert_eq!(
            health(addr).await,
            "127.0.0.1",
            "the peer's address reaches handlers"
        );
        for stream in stalled {
            assert_eq!(
                closed_by_server(stream).await,
                "",
                "an idle socket is closed silently"
            );
        }
        let head = closed_by_server(half_head).await;
        assert!(
            head.is_empty() || head.starts_with("HTTP/1.1 408"),
            "a head never finished is closed: {head:?}"
        );
        let body = closed_by_server(half_body).await;
        assert!(
            !body.starts_with("HTTP/1.1 200"),
            "a body never finished is not taken for a whole one: {body:?}"
        );
        // A whole request still gets its answer, and the server still answers afterwards.
        let mut whole = TcpStream::connect(addr).await.unwrap();
        whole
            .write_all(b"POST /upload HTTP/1.1\r\nHost: gpuledger\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc")
            .await
            .unwrap();
        let answer = closed_by_server(whole).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("\r\n\r\n3"), "{answer}");
        assert_eq!(health(addr).await, "127.0.0.1");
    }

    #[tokio::test]
    async fn past_the_cap_a_client_waits_until_a_connection_closes() {
        let addr = start(ConnectionLimits {
            header_read: Duration::from_secs(120),
            max_connections: 1,
            ..ConnectionLimits::default()
        })
        .await;
        let holder = TcpStream::connect(addr).await.unwrap();
        // Let the server take the first connection before the second comes.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let waiting = tokio::spawn(health(addr));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !waiting.is_finished(),
            "the second client is not served past the cap"
        );
        drop(holder);
        assert_eq!(waiting.await.unwrap(), "127.0.0.1");
    }

    #[test]
    fn the_cap_fits_in_the_open_file_limit() {
        let asked = ConnectionLimits {
            max_connections: usize::MAX / 2,
            ..ConnectionLimits::default()
        };
        let kept = asked.within_open_file_limit().max_connections;
        assert!(kept >= 1 && kept < asked.max_connections, "{kept}");
        let (soft, _) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
        assert!((kept as u64) + DESCRIPTORS_KEPT_FREE <= soft.max(DESCRIPTORS_KEPT_FREE + 1));
        assert_eq!(
            ConnectionLimits::default()
                .within_open_file_limit()
                .header_read,
            Duration::from_secs(30)
        );
    }
}
