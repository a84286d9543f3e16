//! The admin listener's handler: `/metrics`, `/healthz`, `/readyz`. Never
//! public. Its connections go through the same accept loop, limits and
//! deadlines as every other listener ([`crate::listener`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;

use crate::auth::Authenticator;
use crate::body::{self, Body};
use crate::listener::Handler;
use crate::listener::peer::Peer;
use crate::store::Store;
use crate::telemetry::Metrics;

pub struct Probes {
    pub metrics: Arc<Metrics>,
    pub auth: Arc<Authenticator>,
    pub store: Store,
    /// True once every listener is bound and the certificate loaded; false
    /// again as soon as shutdown starts.
    pub ready: Arc<AtomicBool>,
    /// Whether revocations made on other replicas are heard or polled: said
    /// beside "ready" when polled (still ready: slower, not wrong).
    pub revocations: crate::auth::revocation::Channel,
}

impl Probes {
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
                    Ok(Ok(())) => text(StatusCode::OK, "text/plain", self.ready_text()),
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

impl Probes {
    /// "ready", and on a line of its own why the revocation channel is not
    /// listening, when it is not.
    fn ready_text(&self) -> String {
        match self.revocations.detail() {
            Some(detail) => format!("ready\n{detail}\n"),
            None => "ready".into(),
        }
    }
}

/// The admin listener is hyper's alone.
impl crate::listener::h1fast::FastPath for Probes {
    type Decided = ();
}

impl Handler for Probes {
    async fn handle(&self, req: Request<Incoming>, _conn: std::sync::Arc<Peer>) -> Response<Body> {
        Probes::handle(self, req).await
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
