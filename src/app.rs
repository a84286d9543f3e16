//! The request path as named phases, in this order:
//!
//! 1. [`App::decide`]: the one decision ([`crate::decision`]): limits,
//!    framing, path normalisation, secrets sent in clear, then one
//!    [`Target`]: the API browser, an endpoint keygate answers itself, or a
//!    proxied route;
//! 2. [`App::authenticate`]: the credential, where the target asks for one,
//!    through the decision's [`Gate`];
//! 3. [`App::admit_quota`]: the request quotas of the identity, for a proxied
//!    route, WebSocket upgrades included (decided from local counters, never
//!    waiting on Redis; a platform WebSocket route authenticates after the
//!    upgrade, so its socket counts there, [`crate::websocket`]);
//! 4. for a proxied route: a small body read whole ([`Proxy::buffer`]), then
//!    [`App::admit_in_flight`], [`App::headers_to_upstream`], [`App::forward`],
//!    [`App::headers_to_client`];
//! 5. [`App::log`]: metrics and the access log.
//!
//! What the phases learn about a request travels in its [`Exchange`].

use std::sync::Arc;
use std::time::Instant;

use std::borrow::Cow;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, Uri};
use hyper::body::Incoming;

use crate::address::AddressKey;
use crate::api::{self, Access, EndpointRequest, Endpoints, Matched};
use crate::api_browser::ApiBrowser;
use crate::auth::credential::{self, Credential};
use crate::auth::in_clear::Exposure;
use crate::auth::outcomes::Outcomes;
use crate::auth::{AuthRefusal, Authenticator};
use crate::body::Body;
use crate::config::Settings;
use crate::decision::{
    Admitted, Asked, Channel, Decision, Gate, Input, Parsed, Refusal, Requirement, Rules, Target,
    presented,
};
use crate::error::ApiError;
use crate::identity::{Identity, IdentityMode, Passport, Passports, platform};
use crate::listener::framing::AmbiguousFraming;
use crate::listener::h1fast::{Decline, FastPath};
use crate::listener::peer::{Client, Crowded, InFlight, Peer};
use crate::proxy::headers::{self, Added, X_REQUEST_ID};
use crate::proxy::{Proxy, RequestBody, Route, RouteTable, Routes};
use crate::shared_limits::SharedLimits;
use crate::shared_limits::quota::{self, Grant, Quotas};
use crate::shared_limits::seats::Seats;
use crate::telemetry::access::AccessLine;
use crate::telemetry::{Metrics, RouteSeries};
use crate::websocket::{self, Start, Upgrade, WebSockets};

pub struct App {
    settings: Arc<Settings>,
    endpoints: Arc<Endpoints>,
    browser: Option<Arc<ApiBrowser>>,
    auth: Arc<Authenticator>,
    /// The routes in force, shared with the API browser; each request works
    /// on the table it loaded.
    routes: Arc<Routes>,
    proxy: Proxy,
    websockets: Arc<WebSockets>,
    /// The one decision over a request, with its effects; shared with the
    /// WebSocket sessions.
    gate: Arc<Gate>,
    quotas: Arc<Quotas>,
    metrics: Arc<Metrics>,
    series: Series,
    /// Base of the links keygate builds when no public base URL is configured
    /// and no trusted proxy forwarded a host: this machine's own listener.
    listener_base_url: String,
    /// Issues what `assertion` and `platform` routes carry upstream.
    passports: Arc<Passports>,
}

/// The metric series of what the request path counts, resolved once.
struct Series {
    /// One per endpoint of [`api::ROUTES`], in its order.
    endpoints: Vec<RouteSeries>,
    browser: RouteSeries,
    unmatched: RouteSeries,
}

/// One request on its way through the phases: what they all read, and what
/// the log phase reports.
struct Exchange<'t> {
    started: Instant,
    method: Method,
    client: Client<'t>,
    request_id: HeaderValue,
    /// Kept only when the access log is on.
    logged: Option<Logged>,
    /// The target's series and label, once dispatched.
    route: Option<&'t RouteSeries>,
    upstream: Option<&'t str>,
    identity: Option<Identity>,
    /// Why the credential was refused, for the access log.
    refusal: Option<AuthRefusal>,
    /// The request's credential, parsed once.
    credential: Parsed,
    /// A WebSocket upgrade.
    upgrade: bool,
}

/// What only the access log needs; a `Uri` or `HeaderValue` clone shares its
/// bytes, and nothing is kept when the log is off.
struct Logged {
    uri: Uri,
    traceparent: Option<HeaderValue>,
}

/// What [`App::fast_decide`] found for a request the lean path takes: the
/// routes it decided on (a reload meanwhile does not change the request's),
/// its route's place there, its normalised path when normalising changed
/// it, and its credential, parsed once.
pub struct FastRoute {
    routes: Arc<RouteTable>,
    route: usize,
    path: Option<String>,
    credential: Parsed,
}

/// What the request path shares with the rest of the server besides its
/// settings: the limits counted with other replicas, and the rules added to
/// the decision ([`crate::decision::Rule`]).
pub struct Shared {
    pub limits: SharedLimits,
    pub rules: Rules,
}

impl App {
    pub fn new(
        settings: Arc<Settings>,
        endpoints: Endpoints,
        routes: Arc<Routes>,
        auth: Arc<Authenticator>,
        metrics: Arc<Metrics>,
        listener_base_url: String,
        shared: Shared,
    ) -> App {
        let Shared { limits, rules } = shared;
        let passports = auth.caches().passports.clone();
        let proxy = Proxy::new(&settings.proxy, &settings.limits, settings.worker_count());
        let gate = Arc::new(Gate::new(
            Decision::new(&settings, rules),
            auth.clone(),
            Outcomes::new(&metrics),
            limits.quotas.clone(),
        ));
        let websockets = Arc::new(WebSockets::new(
            &settings,
            auth.clone(),
            &metrics,
            limits.seats,
            gate.clone(),
            passports.clone(),
        ));
        let browser = settings
            .api_browser
            .enabled
            .then(|| Arc::new(ApiBrowser::new(routes.clone())));
        let series = Series {
            endpoints: api::ROUTES
                .iter()
                .map(|route| metrics.route_series(route.pattern))
                .collect(),
            browser: metrics.route_series("api_browser"),
            unmatched: metrics.route_series("unmatched"),
        };
        App {
            series,
            settings,
            endpoints: Arc::new(endpoints),
            browser,
            auth,
            routes,
            proxy,
            websockets,
            gate,
            quotas: limits.quotas,
            metrics,
            listener_base_url,
            passports,
        }
    }

    /// The WebSocket counts shared with other replicas, which the server
    /// publishes.
    pub fn seats(&self) -> Option<&Arc<Seats>> {
        self.websockets.seats()
    }

    /// The API browser, when enabled: the server runs its refresh.
    pub fn browser(&self) -> Option<&Arc<ApiBrowser>> {
        self.browser.as_ref()
    }

    /// The request quotas, whose sync the server runs.
    pub fn quotas(&self) -> &Arc<Quotas> {
        &self.quotas
    }

    /// The routes in force; [`Routes::replace`] swaps them for every reader.
    pub fn routes(&self) -> &Arc<Routes> {
        &self.routes
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The sealer of second-factor secrets, shared with the sync's import.
    pub fn two_factor_sealer(&self) -> Arc<crate::auth::at_rest::Sealer> {
        self.endpoints.two_factor.sealer()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn authenticator(&self) -> &Arc<Authenticator> {
        &self.auth
    }

    /// `scheme://host` for links: the configured public base URL; else what a
    /// trusted proxy forwarded; else this machine's listener. A client's own
    /// Host header is never used: it would let anyone choose where a link points.
    fn base_url(&self, client: &Client<'_>, req: &Request<Incoming>) -> String {
        if let Some(base) = &self.settings.public_base_url {
            return base.clone();
        }
        let forwarded_host = client
            .trusted()
            .then(|| req.headers().get(&headers::X_FORWARDED_HOST))
            .flatten()
            .and_then(|h| h.to_str().ok())
            .filter(|h| !h.is_empty() && h.parse::<http::uri::Authority>().is_ok());
        match forwarded_host {
            Some(host) => {
                let scheme = if client.secure { "https" } else { "http" };
                format!("{scheme}://{host}")
            }
            None => self.listener_base_url.clone(),
        }
    }

    /// Handles one request; every error becomes a contract response here.
    pub async fn handle(&self, req: Request<Incoming>, conn: Arc<Peer>) -> Response<Body> {
        let routes = self.routes.load();
        let credential = credential::parse(req.headers());
        let mut ex = self.exchange(&req, &conn, credential);
        ex.upgrade = websocket::is_upgrade(&req);
        let mut response = match self.process(&routes, req, &mut ex).await {
            Ok(response) => response,
            Err(error) => error.into_response(),
        };
        response
            .headers_mut()
            .insert(X_REQUEST_ID.clone(), ex.request_id.clone());
        self.log(&ex, &response);
        response
    }

    /// The request's context, worked out once from its connection and head.
    fn exchange<'t, B>(
        &self,
        req: &Request<B>,
        conn: &'t Peer,
        credential: Parsed,
    ) -> Exchange<'t> {
        let logged = self.settings.log.access_log.then(|| Logged {
            uri: req.uri().clone(),
            traceparent: req.headers().get(TRACEPARENT).cloned(),
        });
        Exchange {
            started: Instant::now(),
            method: req.method().clone(),
            client: conn.client(req.headers()),
            request_id: headers::request_id(req.headers(), conn.trusted),
            logged,
            route: None,
            upstream: None,
            identity: None,
            refusal: None,
            credential,
            upgrade: false,
        }
    }

    /// The phases in order; each returns early with the error a client sees.
    async fn process<'t>(
        &'t self,
        routes: &'t RouteTable,
        req: Request<Incoming>,
        ex: &mut Exchange<'t>,
    ) -> Result<Response<Body>, ApiError> {
        // Normalise from a shared copy of the Uri, so the (usually borrowed)
        // path outlives moving the request on.
        let uri = req.uri().clone();
        let Admitted { path, target } = match self.decide(routes, &req, &uri, ex) {
            Ok(admitted) => admitted,
            Err(Refusal::InClear(exposure)) => {
                return Err(self.refuse_in_clear(&req, ex, exposure).await);
            }
            Err(refusal) => return Ok(refusal.into_response()),
        };
        ex.route = Some(match &target {
            Target::ApiBrowser => &self.series.browser,
            Target::Endpoint(matched) => self.endpoint_series(matched),
            Target::Proxied(route) | Target::WebSocket(route, _) => &route.series,
        });
        match target {
            Target::ApiBrowser => serve_browser(self.browser.as_deref(), &req, &path),
            Target::Endpoint(matched) => self.answer(matched, req, &path, ex).await,
            Target::WebSocket(route, label) => {
                self.upgrade(route, label, req, &path, ex, Start::Platform)
            }
            Target::Proxied(route) if ex.upgrade => {
                let requirement = Requirement::proxied(route, &path);
                ex.identity = self.authenticate(&req, requirement, &path, ex).await?;
                // An upgrade is a request like any other to the quotas,
                // counted before anything reaches the upstream.
                let grant = match self.admit_quota(route, ex) {
                    Ok(grant) => grant,
                    Err(refusal) => return Ok(refusal.into_response()),
                };
                let credential = ex.credential.as_ref().ok().cloned();
                let checked = ex.identity.clone().zip(credential);
                let start = Start::Checked(checked);
                let mut response = self.upgrade(route, &route.name, req, &path, ex, start)?;
                grant.write_headers(response.headers_mut());
                Ok(response)
            }
            Target::Proxied(route) => {
                self.proxied(route, req.map(RequestBody::Streamed), &path, ex)
                    .await
            }
        }
    }

    /// A request to a proxied route (not an upgrade), from hyper's path or
    /// the lean one: authenticate, quotas, in-flight bounds, passport,
    /// headers to upstream, forward.
    async fn proxied<'t>(
        &'t self,
        route: &'t Route,
        req: Request<RequestBody>,
        path: &str,
        ex: &mut Exchange<'t>,
    ) -> Result<Response<Body>, ApiError> {
        let requirement = Requirement::proxied(route, path);
        ex.identity = self.authenticate(&req, requirement, path, ex).await?;
        let grant = match self.admit_quota(route, ex) {
            Ok(grant) => grant,
            Err(refusal) => return Ok(refusal.into_response()),
        };
        // A small body streaming in is read whole first, so that a slow one
        // holds no slot and no upstream connection (the lean path's came
        // whole with its head). Boxed: only requests with a body pay for
        // the room its reading takes in this future.
        let mut req = req;
        if matches!(req.body(), RequestBody::Streamed(body) if !http_body::Body::is_end_stream(body))
        {
            req = Box::pin(self.proxy.buffer(route, req, ex.client.conn)).await?;
        } else if matches!(req.body(), RequestBody::Streamed(_))
            && req.method() != http::Method::HEAD
            && req.method() != http::Method::CONNECT
        {
            // No body at all (an HTTP/2 `GET`, or one the lean path left to
            // hyper's driver): it goes over the wire, as the lean path's
            // requests do, not through hyper's client and its dispatch.
            // With the handler's future boxed (`listener::serve`), keygate's
            // CPU per HTTP/2 request fell from 106 to 77 µs
            // (`benches/run`'s HTTP/2 case, against nginx's 66-74).
            req = req.map(|_| RequestBody::Read(bytes::Bytes::new()));
        }
        let in_flight = self.admit_in_flight(ex)?;
        let passport = self.passport(route, ex)?;
        let outgoing = self.headers_to_upstream(route, req, ex, passport.as_ref());
        let mut response = self.forward(route, outgoing, path, ex, in_flight).await?;
        grant.write_headers(response.headers_mut());
        Ok(response)
    }

    /// The one decision ([`Decision::evaluate`]) over a request hyper's
    /// driver read: its normalised path and target, or why it goes no
    /// further.
    fn decide<'t, 'u, B>(
        &'t self,
        routes: &'t RouteTable,
        req: &Request<B>,
        uri: &'u Uri,
        ex: &Exchange<'_>,
    ) -> Result<Admitted<'t, 'u>, Refusal> {
        let input = Input {
            method: req.method(),
            uri,
            headers: req.headers(),
            sender: ex.client.sender(),
            upgrade: ex.upgrade,
            ambiguous_framing: req.extensions().get::<AmbiguousFraming>().is_some(),
            credential: &ex.credential,
        };
        self.gate.decision().evaluate(&input, routes)
    }

    /// Whether the lean HTTP/1.1 path takes a request
    /// ([`crate::listener::h1fast`]), by the one decision
    /// ([`Decision::evaluate`]), as [`App::decide`] asks it for hyper's
    /// driver: the lean path takes a request admitted to a proxied route (not
    /// an upgrade: those were declined), and leaves every refusal and every
    /// other target to hyper's driver, which renders it (and a secret sent
    /// in clear, whose refusal has effects). No side effect here. What it
    /// found, the parsed credential included, goes to [`App::handle_fast`],
    /// which neither decides nor parses again (the path normalised, the
    /// routes looked up and the head measured twice were 1,500 instructions
    /// of a request under callgrind).
    fn fast_decide(&self, req: &Request<()>, conn: &Peer) -> Result<FastRoute, Decline> {
        let credential = credential::parse(req.headers());
        let input = Input {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
            sender: conn.client(req.headers()).sender(),
            upgrade: false,
            ambiguous_framing: false,
            credential: &credential,
        };
        let routes = self.routes.load();
        let (route, path) = match self.gate.decision().evaluate(&input, &routes) {
            Ok(Admitted {
                path,
                target: Target::Proxied(route),
            }) => (routes.index_of(route).ok_or(Decline::NotProxied)?, path),
            Ok(_) | Err(Refusal::NoTarget(_)) => return Err(Decline::NotProxied),
            Err(refusal) => return Err(declined(&refusal)),
        };
        let path = match path {
            Cow::Owned(path) => Some(path),
            Cow::Borrowed(_) => None,
        };
        Ok(FastRoute {
            routes,
            route,
            path,
            credential,
        })
    }

    /// Answers a request the lean path took: the phases of [`App::handle`]
    /// for a proxied route, on the head and body it read, with the route,
    /// path and credential [`App::fast_decide`] found.
    pub async fn handle_fast(
        &self,
        req: Request<()>,
        decided: FastRoute,
        body: Bytes,
        conn: Arc<Peer>,
    ) -> Response<Body> {
        let FastRoute {
            routes,
            route,
            path,
            credential,
        } = decided;
        let mut ex = self.exchange(&req, &conn, credential);
        let uri = req.uri().clone();
        let path = path.as_deref().unwrap_or(uri.path());
        let req = req.map(|()| RequestBody::Read(body));
        let result = match routes.get(route) {
            Some(route) => {
                ex.route = Some(&route.series);
                self.proxied(route, req, path, &mut ex).await
            }
            None => Err(ApiError::not_found()),
        };
        let mut response = result.unwrap_or_else(ApiError::into_response);
        response
            .headers_mut()
            .insert(X_REQUEST_ID.clone(), ex.request_id.clone());
        self.log(&ex, &response);
        response
    }

    /// Answers a WebSocket upgrade; the socket runs on ([`crate::websocket`]).
    fn upgrade<'t>(
        &self,
        route: &'t Route,
        label: &'t str,
        req: Request<Incoming>,
        path: &str,
        ex: &mut Exchange<'t>,
        start: Start,
    ) -> Result<Response<Body>, ApiError> {
        let upgrade = Upgrade {
            route,
            label,
            path,
            client: ex.client,
            from: self.address_key(&ex.client, &req),
            request_id: ex.request_id.clone(),
            start,
        };
        self.websockets.accept(&self.proxy, req, upgrade)
    }

    fn endpoint_series(&self, matched: &Matched) -> &RouteSeries {
        api::ROUTES
            .iter()
            .position(|route| std::ptr::eq(route, matched.route))
            .and_then(|index| self.series.endpoints.get(index))
            .unwrap_or(&self.series.unmatched)
    }

    /// An endpoint keygate answers itself.
    async fn answer(
        &self,
        matched: Matched,
        req: Request<Incoming>,
        path: &str,
        ex: &mut Exchange<'_>,
    ) -> Result<Response<Body>, ApiError> {
        // An MFA configuration token on a route that takes one is left to
        // the handler; any other credential there is checked as usual.
        let mfa_token = match (&matched.route.access, &ex.credential) {
            (Access::Configuring, Ok(Credential::Bearer(token))) => self
                .auth
                .token_keys()
                .verify_mfa_configuration(token.expose())
                .is_ok(),
            _ => false,
        };
        let requirement = Requirement::endpoint(&matched, path, mfa_token);
        let identity = self.authenticate(&req, requirement, path, ex).await?;
        let client = &ex.client;
        let client_ip = client.address(req.headers(), &self.settings.proxy.trusted_proxies);
        let sso_cookie = crate::sso::flow::find_cookie(
            req.headers()
                .get_all(http::header::COOKIE)
                .iter()
                .filter_map(|value| value.to_str().ok()),
        )
        .map(str::to_owned);
        let request = EndpointRequest {
            base_url: self.base_url(client, &req),
            client_ip,
            client_key: AddressKey::of(client_ip, self.settings.limits.ipv6_prefix_len),
            may_send_secrets: client
                .may_send_secrets(self.settings.listen.allow_plaintext_credentials),
            query: req.uri().query().map(str::to_owned),
            body: api::read_body(req, &self.settings.limits).await?,
            identity: identity.clone(),
            params: matched.params,
            bearer: match (&matched.route.access, &ex.credential) {
                (
                    Access::PreVerification | Access::MfaConfiguration,
                    Ok(Credential::Bearer(token)),
                ) => Some(token.clone()),
                (Access::Configuring, Ok(Credential::Bearer(token))) if mfa_token => {
                    Some(token.clone())
                }
                _ => None,
            },
            sso_cookie,
        };
        ex.identity = identity;
        // Endpoints work with the store, so they run where the store lives
        // ([`crate::store::Store::at_home`]).
        let endpoints = self.endpoints.clone();
        let endpoint = matched.route.endpoint;
        self.endpoints
            .store
            .at_home(async move { endpoints.handle(endpoint, request).await })
            .await
            .unwrap_or_else(|error| {
                tracing::error!(%error, "an endpoint could not run");
                Err(ApiError::unavailable())
            })
    }

    /// Counts the request against the quotas of its identity on the route;
    /// over one, the 429 to send instead. Public routes have no identity and
    /// no quota.
    fn admit_quota(&self, route: &Route, ex: &Exchange<'_>) -> Result<Grant, quota::Refusal> {
        self.gate
            .admit_quota(&route.quota_scope, &route.quota, ex.identity.as_ref())
    }

    /// Counts the request in flight on its connection and from its address,
    /// or refuses it (429) when either already has its bound: a client
    /// cannot hold more upstream connections than that, however many
    /// streams or connections it opens.
    fn admit_in_flight(&self, ex: &Exchange<'_>) -> Result<InFlight, ApiError> {
        let limits = &self.settings.limits;
        ex.client
            .conn
            .start_proxied(
                limits.max_in_flight_per_connection,
                limits.max_in_flight_per_address,
            )
            .map_err(|crowded| {
                let bound = match crowded {
                    Crowded::Connection => "connection",
                    Crowded::Address => "address",
                };
                self.metrics.in_flight_refused(bound);
                tracing::debug!(peer = %ex.client.conn.peer, bound, "proxied request over its in-flight bound");
                ApiError::too_many_requests(1)
            })
    }

    /// Every edit of the request head before it leaves
    /// ([`headers::to_upstream`]), with the identity authentication verified.
    /// To a `platform` route, every `token` query parameter is taken out
    /// first, in any escaped spelling: the platform reads a token there, and
    /// a client's own (keygate's) key or token must never reach its URL and
    /// logs. Other routes keep theirs: keygate reads no `token` there, and
    /// the name is their upstream's.
    fn headers_to_upstream<B>(
        &self,
        route: &Route,
        req: Request<B>,
        ex: &Exchange<'_>,
        passport: Option<&Passport>,
    ) -> (http::request::Parts, Added, B) {
        let (mut parts, body) = req.into_parts();
        if route.destination.mode == IdentityMode::Platform {
            platform::strip_token_parameters(&mut parts.uri);
        }
        let added = headers::to_upstream(
            &mut parts,
            &ex.client,
            ex.request_id.clone(),
            ex.identity.as_ref(),
            passport,
        );
        (parts, added, body)
    }

    /// What the route's identity mode adds for the verified identity (an
    /// assertion, or the platform's token); nothing on a `headers` route or
    /// without an identity.
    fn passport(&self, route: &Route, ex: &Exchange<'_>) -> Result<Option<Passport>, ApiError> {
        match &ex.identity {
            Some(identity) => self.passports.issue(&route.destination, identity),
            None => Ok(None),
        }
    }

    /// Sends the prepared request to the route's upstreams.
    async fn forward<'t>(
        &self,
        route: &'t Route,
        (parts, added, body): (http::request::Parts, Added, RequestBody),
        path: &str,
        ex: &mut Exchange<'t>,
        in_flight: InFlight,
    ) -> Result<Response<Body>, ApiError> {
        let version = parts.version;
        match self
            .proxy
            .forward(route, parts, &added, body, path, in_flight)
            .await
        {
            Ok((mut response, upstream)) => {
                ex.upstream = Some(upstream);
                // A proxy answers in its own version, not its upstream's
                // (RFC 9110 6.2): an HTTP/1.0 upstream's answer goes to an
                // HTTP/1.1 client as HTTP/1.1.
                if version <= http::Version::HTTP_11 {
                    *response.version_mut() = version;
                }
                headers::to_client(
                    response.headers_mut(),
                    self.settings.proxy.pass_server_header,
                );
                Ok(response)
            }
            Err(failed) => {
                ex.upstream = failed.upstream;
                Err(failed.error)
            }
        }
    }

    /// The request's metrics, and its access line when the log is on. Fields
    /// without a value (no upstream, no trace, no identity) are left out of
    /// the line rather than written empty.
    fn log(&self, ex: &Exchange<'_>, response: &Response<Body>) {
        let series = ex.route.unwrap_or(&self.series.unmatched);
        let elapsed = ex.started.elapsed();
        series.request(&ex.method, response.status(), elapsed);
        let Some(logged) = &ex.logged else {
            return;
        };
        AccessLine {
            request_id: ex.request_id.to_str().unwrap_or(""),
            method: ex.method.as_str(),
            path: logged.uri.path(),
            route: series.label(),
            status: response.status().as_u16(),
            elapsed,
            peer: ex.client.conn.peer,
            upstream: ex.upstream,
            identity: ex.identity.as_ref(),
            refusal: ex.refusal.as_ref(),
            bytes: http_body::Body::size_hint(response.body()).exact(),
            trace_id: logged.traceparent.as_ref().and_then(trace_id),
            socket: None,
        }
        .emit();
    }

    /// What follows a secret the decision refused as sent in clear, on any
    /// route, public ones included ([`Gate::refuse_in_clear`]).
    async fn refuse_in_clear<B>(
        &self,
        req: &Request<B>,
        ex: &Exchange<'_>,
        exposure: Exposure,
    ) -> ApiError {
        let Ok(credential) = &ex.credential else {
            return ApiError::api_key_over_plain_http();
        };
        let from = self.address_key(&ex.client, req);
        let peer = ex.client.conn.peer;
        self.gate
            .refuse_in_clear(credential, exposure, peer, Some(from), "HTTP")
            .await
    }

    /// The key the request's client address counts under in per-address
    /// limits.
    fn address_key<B>(&self, client: &Client<'_>, req: &Request<B>) -> AddressKey {
        let address = client.address(req.headers(), &self.settings.proxy.trusted_proxies);
        AddressKey::of(address, self.settings.limits.ipv6_prefix_len)
    }

    /// Verifies the request's credential when the target asks for one, and
    /// authorises the request, through the decision's [`Gate`], which counts
    /// and logs every refusal; the access log learns why one was refused.
    /// Secrets sent in clear were refused by the decision already.
    async fn authenticate<B>(
        &self,
        req: &Request<B>,
        requirement: Requirement<'_>,
        path: &str,
        ex: &mut Exchange<'_>,
    ) -> Result<Option<Identity>, ApiError> {
        let asked = Asked {
            method: &ex.method,
            path,
            upgrade: ex.upgrade,
        };
        let client = &ex.client;
        let from = || self.address_key(client, req);
        let credential = presented(&ex.credential);
        let outcome = self
            .gate
            .authenticate(&asked, credential, requirement, from, Channel::Request)
            .await;
        outcome.map_err(|refusal: AuthRefusal| {
            ex.refusal = Some(refusal);
            self.gate.to_api_error(refusal.failure)
        })
    }
}

impl FastPath for App {
    fn fast_path(&self) -> bool {
        self.settings.proxy.fast_path
    }

    type Decided = FastRoute;

    fn fast_decide(&self, req: &Request<()>, conn: &Peer) -> Result<FastRoute, Decline> {
        App::fast_decide(self, req, conn)
    }

    fn fast_declined(&self, reason: Decline) {
        self.metrics.fast_path_declined(reason.label());
    }

    async fn fast_handle(
        &self,
        req: Request<()>,
        decided: FastRoute,
        body: Bytes,
        conn: Arc<Peer>,
    ) -> Response<Body> {
        self.handle_fast(req, decided, body, conn).await
    }
}

impl crate::listener::Handler for App {
    async fn handle(&self, req: Request<Incoming>, conn: Arc<Peer>) -> Response<Body> {
        App::handle(self, req, conn).await
    }
}

/// The API browser answers reads only.
fn serve_browser(
    browser: Option<&ApiBrowser>,
    req: &Request<Incoming>,
    path: &str,
) -> Result<Response<Body>, ApiError> {
    let Some(browser) = browser else {
        return Err(ApiError::not_found());
    };
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        return Err(ApiError::with_message(
            http::StatusCode::METHOD_NOT_ALLOWED,
            crate::error::code::BAD_REQUEST_PARAMS,
            format!("Request method '{}' is not supported", req.method()),
        ));
    }
    Ok(browser.handle(path))
}

const TRACEPARENT: &str = "traceparent";

/// The trace id of a W3C `traceparent` header (`00-<trace id>-<span id>-<flags>`).
fn trace_id(header: &HeaderValue) -> Option<&str> {
    let value = header.to_str().ok()?;
    let id = value.split('-').nth(1)?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) && id.bytes().any(|b| b != b'0'))
        .then_some(id)
}

/// Why the lean path leaves a request the decision refused to hyper's
/// driver, which renders the refusal.
fn declined(refusal: &Refusal) -> Decline {
    match refusal {
        Refusal::HeadTooLarge | Refusal::AmbiguousFraming => Decline::Malformed,
        Refusal::FoldedName(_) => Decline::FoldedName,
        Refusal::Path(_) => Decline::Path,
        Refusal::InClear(_) => Decline::InClear,
        Refusal::NoTarget(_) => Decline::NotProxied,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_ids_are_read_from_valid_traceparent_headers_only() {
        let valid =
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert_eq!(trace_id(&valid), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        let zero =
            HeaderValue::from_static("00-00000000000000000000000000000000-00f067aa0ba902b7-01");
        assert_eq!(trace_id(&zero), None);
        assert_eq!(trace_id(&HeaderValue::from_static("garbage")), None);
    }
}
