//! The request path, one stage a line: limits and framing, path normalisation,
//! cleartext rules, routing, authentication, header editing, forwarding; then
//! the access log and metrics.

use std::net::IpAddr;

use std::sync::Arc;
use std::time::Instant;

use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;

use crate::api::{self, Access, Api, OwnedRequest};
use crate::auth::credential::{self, Credential};
use crate::auth::{AuthFailure, Authenticator};
use crate::body::Body;
use crate::browser::Browser;
use crate::config::Settings;
use crate::conn::Client;
use crate::error::ApiError;
use crate::framing::AmbiguousFraming;
use crate::identity::Identity;
use crate::listener::Transport;
use crate::proxy::headers::{self, X_REQUEST_ID};
use crate::proxy::{Proxy, RouteTable, Routes, path};
use crate::telemetry::Metrics;

pub struct App {
    settings: Arc<Settings>,
    api: Api,
    browser: Option<Arc<Browser>>,
    auth: Arc<Authenticator>,
    /// The routes in force, shared with the API browser; each request works
    /// on the table it loaded.
    routes: Arc<Routes>,
    proxy: Proxy,
    metrics: Arc<Metrics>,
    /// Base of the links keygate builds when no public base URL is configured
    /// and no trusted proxy forwarded a host: this machine's own listener.
    listener_base_url: String,
}

/// What the access log and metrics learn about one request.
#[derive(Default)]
struct Outcome<'a> {
    route: Option<&'a str>,
    upstream: Option<&'a str>,
    identity: Option<Identity>,
}

impl App {
    pub fn new(
        settings: Arc<Settings>,
        api: Api,
        routes: Arc<Routes>,
        browser: Option<Arc<Browser>>,
        auth: Arc<Authenticator>,
        metrics: Arc<Metrics>,
        listener_base_url: String,
    ) -> App {
        let proxy = Proxy::new(&settings.proxy, &settings.limits, metrics.clone());
        App {
            settings,
            api,
            browser,
            auth,
            routes,
            proxy,
            metrics,
            listener_base_url,
        }
    }

    /// The routes in force; [`Routes::replace`] swaps them for every reader.
    pub fn routes(&self) -> &Arc<Routes> {
        &self.routes
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn authenticator(&self) -> &Arc<Authenticator> {
        &self.auth
    }

    fn is_trusted(&self, ip: &IpAddr) -> bool {
        self.settings
            .proxy
            .trusted_proxies
            .iter()
            .any(|net| net.contains(ip))
    }

    fn client(&self, transport: Transport, req: &Request<Incoming>) -> Client {
        let trusted = self.is_trusted(&transport.peer.ip());
        let secure = transport.tls
            || (trusted
                && req
                    .headers()
                    .get(&headers::X_FORWARDED_PROTO)
                    .is_some_and(|v| v == "https"));
        Client {
            transport,
            trusted,
            secure,
        }
    }

    /// The real client address: the peer, or, behind trusted proxies, the
    /// right-most `X-Forwarded-For` entry that is not itself a trusted proxy.
    fn client_ip(&self, client: &Client, headers: &http::HeaderMap) -> IpAddr {
        let peer = client.transport.peer.ip();
        if !client.trusted {
            return peer;
        }
        let chain: Vec<IpAddr> = headers
            .get_all(&headers::X_FORWARDED_FOR)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|entry| entry.trim().parse().ok())
            .collect();
        chain
            .iter()
            .rev()
            .find(|ip| !self.is_trusted(ip))
            .or(chain.first())
            .copied()
            .unwrap_or(peer)
    }

    /// `scheme://host` for links: the configured public base URL; else what a
    /// trusted proxy forwarded; else this machine's listener. A client's own
    /// Host header is never used: it would let anyone choose where a link points.
    fn base_url(&self, client: &Client, req: &Request<Incoming>) -> String {
        if let Some(base) = &self.settings.public_base_url {
            return base.clone();
        }
        let forwarded_host = client
            .trusted
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
    pub async fn handle(&self, req: Request<Incoming>, transport: Transport) -> Response<Body> {
        let started = Instant::now();
        let method = req.method().clone();
        let client = self.client(transport, &req);
        let request_id = headers::request_id(req.headers(), client.trusted);
        // A Uri clone shares its bytes: no copy of the path per request.
        let log_uri = req.uri().clone();
        // Kept only for the access log; a HeaderValue clone shares its bytes.
        let traceparent = if self.settings.log.access_log {
            req.headers().get(TRACEPARENT).cloned()
        } else {
            None
        };
        let mut outcome = Outcome::default();
        let routes = self.routes.load();
        let mut response = match self
            .process(&routes, req, &client, request_id.clone(), &mut outcome)
            .await
        {
            Ok(response) => response,
            Err(error) => error.into_response(),
        };
        response
            .headers_mut()
            .insert(X_REQUEST_ID.clone(), request_id.clone());
        let route = outcome.route.unwrap_or("unmatched");
        let elapsed = started.elapsed();
        self.metrics
            .request(route, &method, response.status(), elapsed);
        if self.settings.log.access_log {
            // Fields without a value (no upstream, no trace, no identity) are
            // left out of the line rather than written empty.
            let identity = outcome.identity.as_ref();
            tracing::info!(
                target: "keygate::access",
                request_id = request_id.to_str().unwrap_or(""),
                method = %method,
                path = %log_uri.path(),
                route,
                status = response.status().as_u16(),
                duration_ms = duration_ms(elapsed),
                bytes = http_body::Body::size_hint(response.body()).exact(),
                upstream = outcome.upstream,
                trace_id = traceparent.as_ref().and_then(trace_id),
                peer = %transport.peer,
                auth = identity.map(|i| i.method.label()),
                user_id = identity.map(|i| tracing::field::display(i.principal.user_id)),
                key_id = identity
                    .and_then(|i| i.api_key_id())
                    .map(tracing::field::display),
            );
        }
        response
    }

    async fn process<'a>(
        &'a self,
        routes: &'a RouteTable,
        req: Request<Incoming>,
        client: &Client,
        request_id: HeaderValue,
        outcome: &mut Outcome<'a>,
    ) -> Result<Response<Body>, ApiError> {
        if header_block_size(&req) > self.settings.limits.max_header_bytes {
            return Err(ApiError::headers_too_large());
        }
        if req.extensions().get::<AmbiguousFraming>().is_some() {
            return Ok(ambiguous_framing());
        }
        // Normalise from a shared copy of the Uri, so the (usually borrowed)
        // path outlives moving the request on.
        let uri = req.uri().clone();
        let normalized = path::normalize(uri.path())
            .map_err(|e| ApiError::bad_request(format!("Invalid request path: {e}")))?;
        self.refuse_secrets_in_clear(client, &req).await?;
        if let Some(browser) = self.browser.as_ref().filter(|_| Browser::owns(&normalized)) {
            outcome.route = Some("api_browser");
            if !matches!(*req.method(), http::Method::GET | http::Method::HEAD) {
                return Err(ApiError::with_message(
                    http::StatusCode::METHOD_NOT_ALLOWED,
                    crate::error::code::BAD_REQUEST_PARAMS,
                    format!("Request method '{}' is not supported", req.method()),
                ));
            }
            return Ok(browser.handle(&normalized));
        }
        if let Some(matched) = api::find(req.method(), &normalized)? {
            outcome.route = Some(matched.route.pattern);
            let identity = match matched.route.access {
                Access::Public => None,
                Access::Authenticated => Some(self.authenticate(&req).await?),
            };
            let owned = OwnedRequest {
                base_url: self.base_url(client, &req),
                client_ip: self.client_ip(client, req.headers()),
                may_send_secrets: client
                    .may_send_secrets(self.settings.listen.allow_plaintext_credentials),
                query: req.uri().query().map(str::to_owned),
                body: api::read_body(req, &self.settings.limits).await?,
                identity: identity.clone(),
                params: matched.params,
            };
            outcome.identity = identity;
            return self.api.handle(matched.route.endpoint, owned).await;
        }
        let route = routes.find(&normalized).ok_or_else(ApiError::not_found)?;
        outcome.route = Some(&route.name);

        let identity = if route.public {
            None
        } else {
            Some(self.authenticate(&req).await?)
        };

        let (mut parts, body) = req.into_parts();
        headers::to_upstream(&mut parts, client, request_id, identity.as_ref());
        outcome.identity = identity;
        match self.proxy.forward(route, parts, body, &normalized).await {
            Ok((response, upstream)) => {
                outcome.upstream = Some(upstream);
                Ok(response)
            }
            Err(failed) => {
                outcome.upstream = failed.upstream;
                Err(failed.error)
            }
        }
    }

    /// Secrets sent in clear, on any route, public ones included: an API key is
    /// refused always (and, when configured, disabled: it crossed the wire in
    /// clear whatever the route); a Bearer token unless the peer may send
    /// secrets in clear ([`Client::may_send_secrets`]).
    async fn refuse_secrets_in_clear(
        &self,
        client: &Client,
        req: &Request<Incoming>,
    ) -> Result<(), ApiError> {
        if client.secure {
            return Ok(());
        }
        match credential::parse(req.headers()) {
            Ok(Credential::ApiKey(key)) => {
                tracing::warn!(target: "keygate::security", peer = %client.transport.peer, "refused an API key sent over plain HTTP");
                if self.settings.disable_key_on_plaintext {
                    self.auth.disable_exposed_key(&key).await;
                }
                self.metrics
                    .auth("api_key", AuthFailure::PlaintextRefused.label());
                Err(AuthFailure::PlaintextRefused.to_api_error())
            }
            Ok(Credential::Bearer(_))
                if !client.may_send_secrets(self.settings.listen.allow_plaintext_credentials) =>
            {
                tracing::warn!(target: "keygate::security", peer = %client.transport.peer, "refused a Bearer token sent over plain HTTP");
                self.metrics
                    .auth("jwt", AuthFailure::PlaintextRefused.label());
                Err(ApiError::credentials_over_plain_http())
            }
            _ => Ok(()),
        }
    }

    /// Parses and verifies the credential, counting the outcome. Secrets sent
    /// in clear were refused before routing.
    async fn authenticate(&self, req: &Request<Incoming>) -> Result<Identity, ApiError> {
        let result = match credential::parse(req.headers()) {
            Err(e) => Err(("none", AuthFailure::from(e))),
            Ok(credential) => {
                let method = match credential {
                    Credential::ApiKey(_) => "api_key",
                    Credential::Bearer(_) => "jwt",
                };
                self.auth
                    .verify(&credential)
                    .await
                    .map_err(|f| (method, f))
                    .map(|i| (method, i))
            }
        };
        match result {
            Ok((method, identity)) => {
                self.metrics.auth(method, "accepted");
                Ok(identity)
            }
            Err((method, failure)) => {
                self.metrics.auth(method, failure.label());
                Err(failure.to_api_error())
            }
        }
    }
}

impl crate::listener::Handler for App {
    async fn handle(&self, req: Request<Incoming>, transport: Transport) -> Response<Body> {
        App::handle(self, req, transport).await
    }
}

/// A request that stated its body length two ways (`Content-Length` and
/// `Transfer-Encoding`) is refused, not repaired: a server behind keygate might
/// read it the other way (request smuggling). The connection is closed, as what
/// follows on it cannot be trusted to start a new request.
fn ambiguous_framing() -> Response<Body> {
    let mut response =
        ApiError::bad_request("Request has both Content-Length and Transfer-Encoding")
            .into_response();
    response
        .headers_mut()
        .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    response
}

const TRACEPARENT: &str = "traceparent";

/// Milliseconds rounded to whole microseconds: `0.021`, not `0.020661000000000002`.
fn duration_ms(elapsed: std::time::Duration) -> f64 {
    let micros = elapsed.as_nanos().saturating_add(500) / 1000;
    micros as f64 / 1000.0
}

/// The trace id of a W3C `traceparent` header (`00-<trace id>-<span id>-<flags>`).
fn trace_id(header: &HeaderValue) -> Option<&str> {
    let value = header.to_str().ok()?;
    let id = value.split('-').nth(1)?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) && id.bytes().any(|b| b != b'0'))
        .then_some(id)
}

/// Approximate size of the request head as sent: names, values and separators.
fn header_block_size<B>(req: &Request<B>) -> usize {
    req.headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum::<usize>()
        + req.uri().path_and_query().map_or(0, |p| p.as_str().len())
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

    #[test]
    fn access_log_durations_have_at_most_microsecond_decimals() {
        use std::time::Duration;
        for (elapsed, shown) in [
            (Duration::from_nanos(20_661), "0.021"),
            (Duration::from_nanos(20_461), "0.02"),
            (Duration::from_micros(20_661), "20.661"),
            (Duration::from_nanos(999), "0.001"),
            (Duration::from_nanos(499), "0"),
            (
                Duration::from_secs(3) + Duration::from_micros(7),
                "3000.007",
            ),
        ] {
            assert_eq!(format!("{}", duration_ms(elapsed)), shown, "{elapsed:?}");
        }
        // Every whole number of microseconds prints with at most 3 decimals.
        for micros in (0..2_000_000u64).step_by(7) {
            let text = format!("{:?}", duration_ms(Duration::from_micros(micros)));
            let decimals = text.split_once('.').map_or(0, |(_, d)| d.len());
            assert!(decimals <= 3, "{micros} µs printed as {text}");
        }
    }
}
