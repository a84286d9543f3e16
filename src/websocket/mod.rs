//! WebSockets through keygate: the platform's live subscriptions, and plain
//! WebSocket proxying on other routes.
//!
//! On a configured WebSocket route ([`crate::config::WebSocketSettings`])
//! keygate answers the upgrade itself, then authenticates the socket the
//! platform's way: `?token=<JWT>` on the upgrade, an `X-Authorization` header
//! on it, or the first text frame's `authCmd` ([`first_frame`]). Only then it
//! opens the upstream socket, with the verified identity headers
//! ([`crate::proxy::headers::to_upstream`]), and splices frames both ways
//! ([`session`]). An upgrade on any other route is authenticated like any
//! request, and spliced the same way.
//!
//! A socket counts against the request quotas of its identity once, before
//! its upstream is contacted: an upgrade on another route as the request it
//! is (429 when over), a socket on a WebSocket route once authenticated
//! (closed 1008 "Too many requests" when over).
//!
//! A socket holds its credential in [`crate::auth::live`]: a revocation wakes
//! it, it verifies again, and closes with 1008 when the credential died; it
//! also verifies again unprompted at least once per `cache.ttl`, for changes
//! no revocation announces ([`splice`]). The
//! same registry counts sockets per user and per tenant, and with Redis
//! those counts are shared with the other replicas ([`seat`]).

mod ending;
pub mod first_frame;
mod handshake;
mod metrics;
mod seat;
mod session;
mod splice;

use std::sync::Arc;
use std::time::Instant;

use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;

use crate::address::AddressKey;
use crate::auth::Authenticator;
use crate::auth::credential::Credential;
use crate::body::Body;
use crate::config::{Settings, WebSocketSettings};
use crate::decision::Gate;
use crate::error::ApiError;
use crate::identity::{Identity, Passports};
use crate::listener::peer::Client;
use crate::proxy::{Proxy, Route};
use crate::shared_limits::quota::RouteQuota;
use crate::shared_limits::seats::Seats;
use crate::telemetry::Metrics;

pub use handshake::is_upgrade;
use metrics::SocketMetrics;
pub use seat::seats_held;
pub(crate) use session::socket_config;
use session::{Opening, Session};

/// Everything a socket needs, shared by all of them.
pub struct WebSockets {
    settings: WebSocketSettings,
    auth: Arc<Authenticator>,
    metrics: SocketMetrics,
    /// The one decision over requests, with its effects: a socket's
    /// credential is refused in clear, verified, authorised, counted and
    /// its quotas admitted there, as a request's.
    gate: Arc<Gate>,
    access_log: bool,
    /// The per-user and per-tenant counts shared with other replicas.
    seats: Option<Arc<Seats>>,
    /// How often at least an open socket verifies its credential again
    /// unprompted: `cache.ttl`, how stale a cached state may be.
    recheck_every: std::time::Duration,
    /// Issues what `assertion` and `platform` routes carry upstream.
    passports: Arc<Passports>,
}

/// How a socket on a WebSocket route is to be authenticated.
pub enum Start {
    /// The platform's ways: from the upgrade, else from the first frame.
    Platform,
    /// Already checked like any request (another route): its identity, if
    /// the route asks for one, and the credential to re-check.
    Checked(Option<(Identity, Credential)>),
}

/// The quotas of the route a socket falls under, for a socket that counts
/// once authenticated.
pub struct SocketQuota {
    pub scope: Arc<str>,
    pub quota: RouteQuota,
}

/// What the request path hands over for one upgrade.
pub struct Upgrade<'r> {
    pub route: &'r Route,
    /// The WebSocket route that matched, or the proxied route's name.
    pub label: &'r str,
    pub path: &'r str,
    pub client: Client<'r>,
    /// The key the client's address counts under: unknown API keys it
    /// presents are paid from its budget, as on any request.
    pub from: AddressKey,
    pub request_id: HeaderValue,
    pub start: Start,
}

impl WebSockets {
    pub fn new(
        settings: &Settings,
        auth: Arc<Authenticator>,
        metrics: &Metrics,
        seats: Option<Arc<Seats>>,
        gate: Arc<Gate>,
        passports: Arc<Passports>,
    ) -> WebSockets {
        let websocket = settings.websocket.clone();
        let labels: Vec<&str> = websocket.routes.iter().map(String::as_str).collect();
        WebSockets {
            metrics: SocketMetrics::new(metrics, &labels),
            gate,
            settings: websocket,
            auth,
            access_log: settings.log.access_log,
            seats,
            recheck_every: settings.cache.ttl,
            passports,
        }
    }

    /// The counts shared with other replicas, if any.
    pub fn seats(&self) -> Option<&Arc<Seats>> {
        self.seats.as_ref()
    }

    /// Answers the upgrade (101) and serves the socket on its own task.
    pub fn accept(
        self: &Arc<Self>,
        proxy: &Proxy,
        mut req: Request<Incoming>,
        upgrade: Upgrade<'_>,
    ) -> Result<Response<Body>, ApiError> {
        let accept_key = handshake::accept_key(&req)?;
        let on_upgrade = hyper::upgrade::on(&mut req);
        let hold = req.extensions_mut().remove::<crate::listener::Hold>();
        let (mut parts, _body) = req.into_parts();
        let (query, opening, quota) = match upgrade.start {
            Start::Platform => {
                let query = handshake::take_token(&mut parts.uri);
                let credential =
                    handshake::upgrade_credential(query.token.as_deref(), &parts.headers);
                let route = upgrade.route;
                let quota = SocketQuota {
                    scope: route.quota_scope.clone(),
                    quota: route.quota,
                };
                (query.rest, Opening::Platform(credential), Some(quota))
            }
            // Counted by the request path, as the request it was.
            Start::Checked(checked) => (
                parts.uri.query().map(str::to_owned),
                Opening::Checked(checked),
                None,
            ),
        };
        let (uri, upstream, endpoint) = proxy
            .websocket_upstream(upgrade.route, upgrade.path, query.as_deref())
            .ok_or_else(ApiError::unavailable)?;
        let session = Session {
            sockets: self.clone(),
            conn: upgrade.client.conn.clone(),
            secure: upgrade.client.secure,
            from: upgrade.from,
            parts,
            upstream_uri: uri,
            upstream: upstream.to_owned(),
            endpoint: endpoint.clone(),
            tls_failures: upgrade.route.tls_failures(),
            connect_timeout: proxy.connect_timeout(),
            request_id: upgrade.request_id,
            label: upgrade.label.to_owned(),
            path: upgrade.path.into(),
            started: Instant::now(),
            hold,
            quota,
            destination: upgrade.route.destination.clone(),
        };
        tokio::spawn(session.run(on_upgrade, opening));
        Ok(handshake::switching_protocols(&accept_key))
    }
}
