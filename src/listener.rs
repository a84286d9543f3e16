//! Accepting connections: TCP, optional TLS, HTTP/1.1 and HTTP/2 (ALPN or prior
//! knowledge), the connection limit, and a graceful drain on shutdown.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;

use crate::app::App;

/// What the connection tells about a request: was TLS terminated here, and who
/// is the peer.
#[derive(Debug, Clone, Copy)]
pub struct Transport {
    pub tls: bool,
    pub peer: SocketAddr,
    /// Listener name, for metrics: "https" or "http".
    pub listener: &'static str,
}

/// Serves one listener until `shutdown` turns true, then drains open
/// connections for at most `grace`.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: Arc<App>,
    connections: Arc<Semaphore>,
    mut shutdown: watch::Receiver<bool>,
) {
    let name: &'static str = if tls.is_some() { "https" } else { "http" };
    let limits = app.settings().limits.clone();
    let grace = app.settings().shutdown_grace;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size((limits.max_header_bytes * 2).max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size((limits.max_header_bytes * 2) as u32);
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();

    loop {
        let permit = tokio::select! {
            _ = shutdown.changed() => break,
            permit = connections.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(error) => {
                    tracing::warn!(%error, listener = name, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let transport = Transport {
            tls: tls.is_some(),
            peer,
            listener: name,
        };
        let metrics = app.metrics().clone();
        let app = app.clone();
        let service = service_fn(move |req| {
            let app = app.clone();
            async move { Ok::<_, std::convert::Infallible>(app.handle(req, transport).await) }
        });
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let tls = tls.clone();
        let handshake_timeout = limits.tls_handshake_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            metrics.connection_opened(name);
            match tls {
                Some(acceptor) => {
                    match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(tls_stream)) => {
                            let conn = builder.serve_connection(TokioIo::new(tls_stream), service);
                            let _ = watcher.watch(conn.into_owned()).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%error, %peer, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
                None => {
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    let _ = watcher.watch(conn.into_owned()).await;
                }
            }
            metrics.connection_closed(name);
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            listener = name,
            "shutdown grace period ended with connections still open"
        );
    }
}
