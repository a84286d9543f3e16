//! The admin listener: `/metrics`, `/healthz`, `/readyz`. Never public.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::auth::Authenticator;
use crate::body::{self, Body};
use crate::store::Store;
use crate::telemetry::Metrics;

pub struct Admin {
    pub metrics: Arc<Metrics>,
    pub auth: Arc<Authenticator>,
    pub store: Store,
    /// True once every listener is bound and the certificate loaded; false
    /// again as soon as shutdown starts.
    pub ready: Arc<AtomicBool>,
}

impl Admin {
    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        match req.uri().path() {
            "/metrics" => {
                self.metrics.set_cache_entries(&self.auth.caches().sizes());
                text(
                    StatusCode::OK,
                    "text/plain; version=0.0.4; charset=utf-8",
                    self.metrics.render(),
                )
            }
            "/healthz" => text(StatusCode::OK, "text/plain", "ok".into()),
            "/readyz" => {
                if !self.ready.load(Ordering::Relaxed) {
                    return text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "text/plain",
                        "not ready".into(),
                    );
                }
                match tokio::time::timeout(std::time::Duration::from_secs(2), self.store.ping())
                    .await
                {
                    Ok(Ok(())) => text(StatusCode::OK, "text/plain", "ready".into()),
                    _ => text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "text/plain",
                        "store unavailable".into(),
                    ),
                }
            }
            _ => crate::error::ApiError::not_found().into_response(),
        }
    }
}

fn text(status: StatusCode, content_type: &'static str, body_text: String) -> Response<Body> {
    let mut response = Response::new(body::full(body_text));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// Serves the admin endpoints until shutdown.
pub async fn serve(listener: TcpListener, admin: Arc<Admin>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(_) => continue,
            },
        };
        let admin = admin.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let admin = admin.clone();
                async move { Ok::<_, std::convert::Infallible>(admin.handle(req).await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
