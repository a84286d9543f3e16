//! The request path, one stage a line: limits, path normalisation, routing,
//! authentication, identity, forwarding; then the access log and metrics.

use std::net::IpAddr;

use arc_swap::ArcSwap;
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
use crate::error::ApiError;
use crate::identity::{self, Identity};
use crate::listener::Transport;
use crate::proxy::headers::{self, X_REQUEST_ID};
use crate::proxy::{Proxy, RouteTable, path};
use crate::telemetry::Metrics;

pub struct App {
    settings: Arc<Settings>,
    api: Api,
    browser: Option<Arc<Browser>>,
    auth: Arc<Authenticator>,
    /// Swapped whole on reload; each request works on the table it loaded.
    routes: ArcSwap<RouteTable>,
    proxy: Proxy,
    metrics: Arc<Metrics>,
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
        browser: Option<Arc<Browser>>,
        auth: Arc<Authenticator>,
        metrics: Arc<Metrics>,
    ) -> App {
        let routes = RouteTable::new(&settings.routes);
        let proxy = Proxy::new(
            &settings.proxy,
            settings.limits.max_body_bytes,
            metrics.clone(),
        );
        App {
            settings,
            api,
            browser,
            auth,
            routes: ArcSwap::from_pointee(routes),
            proxy,
            metrics,
        }
    }

    /// Replaces the route table atomically: requests already routed finish on
    /// the old one, new requests see the new one.
    pub fn replace_routes(&self, specs: &[crate::config::RouteSpec]) {
        self.routes.store(Arc::new(RouteTable::new(specs)));
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

    /// Is the peer one of the configured trusted proxies?
    fn trusted(&self, transport: &Transport) -> bool {
        let ip = transport.peer.ip();
        self.settings
            .proxy
            .trusted_proxies
            .iter()
            .any(|net| net.contains(&ip))
    }

    /// Did this request reach keygate over HTTPS (here, or at a trusted proxy)?
    fn is_https(&self, transport: &Transport, trusted: bool, req: &Request<Incoming>) -> bool {
        transport.tls
            || (trusted
                && req
                    .headers()
                    .get(&headers::X_FORWARDED_PROTO)
                    .is_some_and(|v| v == "https"))
    }

    /// The real client address: the peer, or, behind trusted proxies, the
    /// right-most `X-Forwarded-For` entry that is not itself a trusted proxy.
    fn client_ip(&self, transport: &Transport, trusted: bool, headers: &http::HeaderMap) -> IpAddr {
        if !trusted {
            return transport.peer.ip();
        }
        let is_trusted = |ip: &IpAddr| {
            self.settings
                .proxy
                .trusted_proxies
                .iter()
                .any(|n| n.contains(ip))
        };
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
            .find(|ip| !is_trusted(ip))
            .or(chain.first())
            .copied()
            .unwrap_or_else(|| transport.peer.ip())
    }

    /// `scheme://host` as the client reached keygate (or the trusted proxy in front).
    fn base_url(&self, transport: &Transport, trusted: bool, req: &Request<Incoming>) -> String {
        let scheme = if self.is_https(transport, trusted, req) {
            "https"
        } else {
            "http"
        };
        let forwarded_host = trusted
            .then(|| req.headers().get(&headers::X_FORWARDED_HOST))
            .flatten();
        let host = forwarded_host
            .or_else(|| req.headers().get(http::header::HOST))
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned)
            .or_else(|| req.uri().authority().map(|a| a.to_string()))
            .unwrap_or_else(|| "localhost".into());
        format!("{scheme}://{host}")
    }

    /// Handles one request; every error becomes a contract response here.
    pub async fn handle(&self, req: Request<Incoming>, transport: Transport) -> Response<Body> {
        let started = Instant::now();
        let method = req.method().clone();
        let trusted = self.trusted(&transport);
        let request_id = headers::request_id(req.headers(), trusted);
        // A Uri clone shares its bytes: no copy of the path per request.
        let log_uri = req.uri().clone();
        let trace_id = trace_id(req.headers()).map(str::to_owned);
        let mut outcome = Outcome::default();
        let routes = self.routes.load_full();
        let mut response = match self
            .process(
                &routes,
                req,
                transport,
                trusted,
                request_id.clone(),
                &mut outcome,
            )
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
            let identity = outcome.identity.as_ref();
            tracing::info!(
                target: "keygate::access",
                request_id = request_id.to_str().unwrap_or(""),
                method = %method,
                path = %log_uri.path(),
                route,
                status = response.status().as_u16(),
                duration_ms = elapsed.as_secs_f64() * 1000.0,
                bytes = http_body::Body::size_hint(response.body()).exact(),
                upstream = outcome.upstream.unwrap_or(""),
                trace_id = trace_id.as_deref().unwrap_or(""),
                peer = %transport.peer,
                auth = identity.map(|i| i.method.label()).unwrap_or(""),
                user_id = %identity.map(|i| i.principal.user_id.to_string()).unwrap_or_default(),
                key_id = %identity.and_then(|i| i.api_key_id()).map(|k| k.to_string()).unwrap_or_default(),
            );
        }
        response
    }

    async fn process<'a>(
        &'a self,
        routes: &'a RouteTable,
        req: Request<Incoming>,
        transport: Transport,
        trusted: bool,
        request_id: HeaderValue,
        outcome: &mut Outcome<'a>,
    ) -> Result<Response<Body>, ApiError> {
        if header_block_size(&req) > self.settings.limits.max_header_bytes {
            return Err(ApiError::headers_too_large());
        }
        // Normalise from a shared copy of the Uri, so the (usually borrowed)
        // path outlives moving the request on.
        let uri = req.uri().clone();
        let normalized = path::normalize(uri.path())
            .map_err(|e| ApiError::bad_request(format!("Invalid request path: {e}")))?;
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
                Access::Authenticated => Some(self.authenticate(&transport, trusted, &req).await?),
            };
            let owned = OwnedRequest {
                base_url: self.base_url(&transport, trusted, &req),
                client_ip: self.client_ip(&transport, trusted, req.headers()),
                query: req.uri().query().map(str::to_owned),
                body: api::read_body(req.into_body()).await?,
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
            Some(self.authenticate(&transport, trusted, &req).await?)
        };

        let (mut parts, body) = req.into_parts();
        let authority = parts.uri.authority().map(|a| a.as_str().to_owned());
        headers::remove_hop_by_hop(&mut parts.headers);
        identity::strip_client_identity(&mut parts.headers);
        headers::set_forwarding(
            &mut parts.headers,
            &transport,
            trusted,
            authority.as_deref(),
            request_id,
        );
        parts.headers.remove(http::header::HOST);
        if let Some(identity) = &identity {
            identity::inject(&mut parts.headers, identity);
        }
        outcome.identity = identity;
        let (response, upstream) = self.proxy.forward(route, parts, body, &normalized).await?;
        outcome.upstream = Some(upstream);
        Ok(response)
    }

    /// Parses and verifies the credential, counting the outcome.
    async fn authenticate(
        &self,
        transport: &Transport,
        trusted: bool,
        req: &Request<Incoming>,
    ) -> Result<Identity, ApiError> {
        let result = match credential::parse(req.headers()) {
            Err(e) => Err(("none", AuthFailure::from(e))),
            Ok(Credential::ApiKey(key)) if !self.is_https(transport, trusted, req) => {
                tracing::warn!(peer = %transport.peer, "refused an API key sent over plain HTTP");
                if self.settings.disable_key_on_plaintext {
                    self.auth.disable_exposed_key(&key).await;
                }
                Err(("api_key", AuthFailure::PlaintextRefused))
            }
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

/// The trace id of a W3C `traceparent` header (`00-<trace id>-<span id>-<flags>`).
fn trace_id(headers: &http::HeaderMap) -> Option<&str> {
    let value = headers.get("traceparent")?.to_str().ok()?;
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
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "traceparent",
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        assert_eq!(trace_id(&headers), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        headers.insert(
            "traceparent",
            HeaderValue::from_static("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
        );
        assert_eq!(trace_id(&headers), None);
        headers.insert("traceparent", HeaderValue::from_static("garbage"));
        assert_eq!(trace_id(&headers), None);
    }
}
