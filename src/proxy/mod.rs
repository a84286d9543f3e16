//! Routing and forwarding: the route table, upstream pools, and the one place a
//! request leaves for an upstream.

mod buffering;
mod client;
pub(crate) use client::pin_thread_to_pool;
pub mod headers;
pub mod pacing;
pub(crate) mod stream;
pub mod wire;

use std::sync::Arc;

use arc_swap::ArcSwap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;

use buffering::{Buffered, Resumed};
use client::{Ceiling, SendError, UpstreamClient};
use http::uri::PathAndQuery;
use http::{Request, Response, Uri, Version};
use http_body::Body as _;
use http_body_util::BodyExt as _;
use pacing::{Pace, Paced};
use stream::Endpoint;

use crate::body::{self, Body};
use crate::config::{HttpLimits, ProxySettings, RouteSpec, UpstreamUrl};
use crate::error::ApiError;
use crate::identity::passport::Destination;
use crate::listener::peer::{InFlight, Peer};
use crate::shared_limits::quota::RouteQuota;
use crate::telemetry::{ClientAbort, Metrics, RouteSeries, UpstreamSeries};

/// One upstream base URL and its health.
pub struct Upstream {
    scheme: http::uri::Scheme,
    /// Where its connections go, and their TLS.
    endpoint: Endpoint,
    /// Base path without a trailing slash ("" for none).
    base_path: String,
    /// The `Host` header requests to it carry: host, and port unless the
    /// scheme's (80, 443).
    host_header: http::HeaderValue,
    /// Metric label: the configured URL.
    pub label: String,
    series: UpstreamSeries,
    /// Milliseconds since `epoch` until which the upstream is skipped.
    down_until: AtomicU64,
}

pub struct Route {
    pub name: String,
    pub prefix: String,
    pub public: bool,
    pub timeout: Duration,
    /// The route's own quotas, and the scope its own budgets are counted in.
    pub quota: RouteQuota,
    pub quota_scope: Arc<str>,
    /// The route's request series, labelled with its name.
    pub series: RouteSeries,
    /// How the verified identity travels to its upstream.
    pub destination: Destination,
    upstreams: Vec<Arc<Upstream>>,
    /// Failed TLS handshakes with its `https://` upstreams; `None` when it
    /// has none.
    tls_failures: Option<TlsFailures>,
    next: AtomicUsize,
}

/// The routes, longest prefix first, with the specs they were built from.
pub struct RouteTable {
    routes: Vec<Route>,
    /// As configured, in configuration order.
    specs: Vec<RouteSpec>,
}

/// The routes in force: the one place the request path and the API browser
/// read them. Reload swaps the whole table at once; a request keeps the table
/// it loaded, and the browser is told that the routes changed.
pub struct Routes {
    table: ArcSwap<RouteTable>,
    changed: watch::Sender<()>,
    metrics: Arc<Metrics>,
}

impl Routes {
    pub fn new(specs: &[RouteSpec], metrics: Arc<Metrics>) -> Routes {
        Routes {
            table: ArcSwap::from_pointee(RouteTable::new(specs, &metrics)),
            changed: watch::Sender::new(()),
            metrics,
        }
    }

    /// The table in force now.
    pub fn load(&self) -> Arc<RouteTable> {
        self.table.load_full()
    }

    /// Puts a new table in force and tells those that follow changes.
    pub fn replace(&self, specs: &[RouteSpec]) {
        self.table
            .store(Arc::new(RouteTable::new(specs, &self.metrics)));
        self.changed.send_replace(());
    }

    /// Wakes on every later [`Routes::replace`].
    pub fn subscribe(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }
}

impl Route {
    /// Its count of failed TLS handshakes with its `https://` upstreams.
    pub(crate) fn tls_failures(&self) -> Option<TlsFailures> {
        self.tls_failures.clone()
    }
}

impl RouteTable {
    /// The routes as configured, in configuration order.
    pub fn specs(&self) -> &[RouteSpec] {
        &self.specs
    }

    /// The table for `specs`, with each route's and upstream's metric series
    /// resolved; the error series of each upstream exist (at 0) from here on.
    pub fn new(specs: &[RouteSpec], metrics: &Metrics) -> RouteTable {
        let mut routes: Vec<Route> = specs
            .iter()
            .map(|spec| Route {
                name: spec.name.clone(),
                prefix: spec.prefix.clone(),
                public: spec.public,
                timeout: spec.request_timeout,
                quota: spec.quota,
                quota_scope: Arc::from(format!("route:{}", spec.name)),
                series: metrics.route_series(&spec.name),
                destination: Destination::new(spec.identity, &spec.audience, &spec.name, metrics),
                upstreams: spec
                    .upstreams
                    .iter()
                    .map(|uri| Arc::new(Upstream::new(uri, spec.upstream_tls.as_ref(), metrics)))
                    .collect(),
                tls_failures: spec.upstream_tls.as_ref().map(|_| TlsFailures {
                    route: spec.name.clone(),
                    counter: metrics.upstream_tls_failures(&spec.name),
                }),
                next: AtomicUsize::new(0),
            })
            .collect();
        routes.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
        RouteTable {
            routes,
            specs: specs.to_vec(),
        }
    }

    /// The route of that name.
    pub fn named(&self, name: &str) -> Option<&Route> {
        self.routes.iter().find(|r| r.name == name)
    }

    /// The route whose prefix is the longest match for a normalised path.
    pub fn find(&self, path: &str) -> Option<&Route> {
        self.routes.iter().find(|r| path.starts_with(&r.prefix))
    }

    /// Where `route`, one of this table's, is in it: for [`RouteTable::get`].
    pub fn index_of(&self, route: &Route) -> Option<usize> {
        self.routes.iter().position(|r| std::ptr::eq(r, route))
    }

    /// The route at `index` ([`RouteTable::index_of`]).
    pub fn get(&self, index: usize) -> Option<&Route> {
        self.routes.get(index)
    }
}

impl Upstream {
    fn new(
        url: &UpstreamUrl,
        tls: Option<&crate::tls_client::Connector>,
        metrics: &Metrics,
    ) -> Upstream {
        let label = url.to_string();
        let default_port = if url.is_https() { 443 } else { 80 };
        Upstream {
            scheme: url.scheme().clone(),
            endpoint: Endpoint::of(url, tls),
            base_path: url.base_path().to_string(),
            host_header: http::HeaderValue::from_str(match url.authority().port_u16() {
                Some(port) if port == default_port => url.authority().host(),
                _ => url.authority().as_str(),
            })
            .expect("an authority is a valid header value"),
            series: metrics.upstream_series(&label, &UpstreamError::ALL.map(UpstreamError::label)),
            label,
            down_until: AtomicU64::new(0),
        }
    }

    fn uri(&self, path: &str, query: Option<&str>) -> Result<Uri, http::Error> {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.endpoint.authority().clone())
            .path_and_query(self.path_and_query(path, query)?)
            .build()
    }

    /// The request target sent to the upstream for a request whose target
    /// was `original` and whose normalised path is `path`: the client's own
    /// when there is no base path and normalising changed nothing (a shared
    /// copy: no allocation and no second parse, which every request paid);
    /// else built by [`Upstream::path_and_query`].
    fn target(
        &self,
        path: &str,
        original: Option<&PathAndQuery>,
    ) -> Result<PathAndQuery, http::Error> {
        match original {
            Some(original) if self.base_path.is_empty() && original.path() == path => {
                Ok(original.clone())
            }
            _ => self.path_and_query(path, original.and_then(PathAndQuery::query)),
        }
    }

    /// The request target sent to the upstream (origin form: base path, path
    /// and query).
    fn path_and_query(&self, path: &str, query: Option<&str>) -> Result<PathAndQuery, http::Error> {
        let mut pq = String::with_capacity(
            self.base_path.len() + path.len() + query.map_or(0, |q| q.len() + 1),
        );
        pq.push_str(&self.base_path);
        pq.push_str(path);
        if let Some(q) = query {
            pq.push('?');
            pq.push_str(q);
        }
        Ok(PathAndQuery::try_from(pq)?)
    }
}

/// Forwards requests to upstreams over pooled keep-alive connections.
pub struct Proxy {
    client: Arc<UpstreamClient>,
    connect_timeout: Duration,
    epoch: Instant,
    retry_after: Duration,
    limits: HttpLimits,
}

/// How a request to an upstream failed, as counted against that upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UpstreamError {
    /// Refused or unreachable.
    Connect,
    /// No response head within the route's timeout.
    Timeout,
    /// The connection broke or the response was malformed.
    Reset,
    /// All its connections were in use, and none came free in the queue.
    Saturated,
}

impl UpstreamError {
    const ALL: [UpstreamError; 4] = [
        UpstreamError::Connect,
        UpstreamError::Timeout,
        UpstreamError::Reset,
        UpstreamError::Saturated,
    ];

    fn label(self) -> &'static str {
        match self {
            UpstreamError::Connect => "connect",
            UpstreamError::Timeout => "timeout",
            UpstreamError::Reset => "reset",
            UpstreamError::Saturated => "saturated",
        }
    }
}

/// A request that could not be forwarded, with the upstream it last tried
/// (none when it failed before reaching one), for the access log.
pub struct ForwardError<'r> {
    pub error: ApiError,
    pub upstream: Option<&'r str>,
}

impl From<ApiError> for ForwardError<'_> {
    fn from(error: ApiError) -> Self {
        ForwardError {
            error,
            upstream: None,
        }
    }
}

enum Failure {
    Connect,
    /// The TLS handshake failed, for this reason.
    Handshake(String),
    Timeout,
    Saturated,
    BodyTooLarge,
    /// The client's body, not the upstream, failed: not counted against it.
    ClientBody,
    /// The client's body did not keep its pace ([`pacing`]).
    ClientTooSlow,
    Other,
}

impl Proxy {
    /// `pools`: one per worker thread.
    pub fn new(settings: &ProxySettings, limits: &HttpLimits, pools: usize) -> Proxy {
        let client = UpstreamClient::new(
            settings.connect_timeout,
            settings.pool_idle_timeout,
            settings.pool_max_idle_per_host,
            pools,
            Ceiling {
                per_upstream: settings.max_connections_per_upstream,
                total: settings.max_upstream_connections,
                queue: settings.upstream_queue,
                queue_timeout: settings.upstream_queue_timeout,
            },
        );
        Proxy {
            client,
            connect_timeout: settings.connect_timeout,
            epoch: Instant::now(),
            retry_after: settings.upstream_retry_after,
            limits: limits.clone(),
        }
    }

    /// How long opening a connection to an upstream may take.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Where a WebSocket on `route` goes: one of its upstreams (round-robin,
    /// as for requests), as a `ws://` URI for `path` and `query` (`wss://`
    /// to an `https://` upstream), with the upstream's label and endpoint.
    pub(crate) fn websocket_upstream<'r>(
        &self,
        route: &'r Route,
        path: &str,
        query: Option<&str>,
    ) -> Option<(Uri, &'r str, &'r Endpoint)> {
        let upstream = &route.upstreams[self.pick(route, &[])?];
        let mut parts = upstream.uri(path, query).ok()?.into_parts();
        let scheme = if upstream.endpoint.is_tls() {
            "wss"
        } else {
            "ws"
        };
        parts.scheme = Some(scheme.parse().ok()?);
        Some((
            Uri::from_parts(parts).ok()?,
            upstream.label.as_str(),
            &upstream.endpoint,
        ))
    }

    fn error(&self, upstream: &Upstream, kind: UpstreamError) {
        upstream.series.error(kind as usize);
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Skips `upstream` for `proxy.upstream_retry_after`.
    fn mark_down(&self, upstream: &Upstream) {
        upstream.down_until.store(
            self.now_ms() + self.retry_after.as_millis() as u64,
            Ordering::Relaxed,
        );
    }

    /// Round-robin over the route's upstreams, skipping any marked down while a
    /// healthy one remains.
    fn pick(&self, route: &Route, skip: &[usize]) -> Option<usize> {
        let n = route.upstreams.len();
        let start = route.next.fetch_add(1, Ordering::Relaxed);
        let now = self.now_ms();
        let candidates = (0..n)
            .map(|i| (start + i) % n)
            .filter(|i| !skip.contains(i));
        let mut fallback = None;
        for i in candidates {
            if route.upstreams[i].down_until.load(Ordering::Relaxed) <= now {
                return Some(i);
            }
            fallback.get_or_insert(i);
        }
        fallback
    }

    /// Counts a failed attempt against its upstream (a connect failure also
    /// marks it down for a while); `None` when another upstream may be tried.
    fn failed(
        &self,
        route: &Route,
        upstream: &Upstream,
        failure: Failure,
        may_retry: bool,
    ) -> Option<ApiError> {
        Some(match failure {
            Failure::Handshake(reason) => {
                // Counted as a failure to connect (the upstream is skipped
                // for a while too), and on the route's own counter.
                self.error(upstream, UpstreamError::Connect);
                self.mark_down(upstream);
                if let Some(failures) = &route.tls_failures {
                    failures.count(upstream.endpoint.host(), &reason);
                }
                if may_retry {
                    return None;
                }
                ApiError::upstream_tls_failed()
            }
            Failure::Connect => {
                self.error(upstream, UpstreamError::Connect);
                self.mark_down(upstream);
                tracing::warn!(upstream = %upstream.label, "upstream refused the connection; skipping it for a while");
                if may_retry {
                    return None;
                }
                ApiError::bad_gateway()
            }
            Failure::Timeout => {
                self.error(upstream, UpstreamError::Timeout);
                ApiError::gateway_timeout()
            }
            Failure::Saturated => {
                self.error(upstream, UpstreamError::Saturated);
                tracing::warn!(upstream = %upstream.label, "upstream at its connection ceiling; request refused");
                ApiError::upstream_busy()
            }
            Failure::BodyTooLarge => ApiError::body_too_large(),
            Failure::ClientBody => {
                tracing::debug!(upstream = %upstream.label, "the client's request body broke off or was malformed");
                ApiError::bad_request("Request body could not be read")
            }
            Failure::ClientTooSlow => {
                tracing::debug!(upstream = %upstream.label, "the client's request body arrived too slowly");
                ApiError::request_timeout()
            }
            Failure::Other => {
                self.error(upstream, UpstreamError::Reset);
                ApiError::bad_gateway()
            }
        })
    }

    /// The client's body as sent on: held to its pace when there is one, and
    /// cut off at `limits.max_body_bytes` when its length was not declared.
    fn request_body(
        &self,
        incoming: hyper::body::Incoming,
        declared: bool,
        version: Version,
    ) -> Body {
        if incoming.is_end_stream() {
            return body::boxed(incoming.map_err(body::ClientBodyError));
        }
        self.paced_body(Paced::new(incoming, self.pace()), 0, declared, version)
    }

    /// The pace a client's body must keep, from `[limits]`.
    fn pace(&self) -> Pace {
        Pace {
            gap: self.limits.body_read_timeout,
            min_rate: self.limits.min_body_rate,
        }
    }

    /// [`Proxy::request_body`] of a paced body of which `read` bytes were
    /// read already.
    fn paced_body(&self, paced: Paced, read: u64, declared: bool, version: Version) -> Body {
        if declared {
            return body::boxed(paced);
        }
        body::boxed(Capped {
            inner: Some(paced),
            read,
            version,
            limits: self.limits.clone(),
        })
    }

    /// Reads a small request body whole before anything upstream is taken
    /// ([`buffering`]): called before the request's in-flight slot is taken
    /// and before [`Proxy::forward`]. A streamed body of a declared length
    /// up to `limits.buffered_body_bytes` (and `max_body_bytes`), or of no
    /// declared length, is read at its pace (that of a `HEAD` or `CONNECT`
    /// streams); what ends within the limit goes on whole, with its
    /// `Content-Length`; what passes it goes on as the part read, then the
    /// rest, as does one that finds its connection's budget of bytes held
    /// by bodies being read spent ([`buffering::CONNECTION_BUDGET`]). A body
    /// that breaks off or is too slow is the client's, answered and counted
    /// as when it streams (400, 408).
    pub async fn buffer(
        &self,
        route: &Route,
        req: Request<RequestBody>,
        conn: &Peer,
    ) -> Result<Request<RequestBody>, ApiError> {
        let limit = self
            .limits
            .buffered_body_bytes
            .min(self.limits.max_body_bytes);
        let (mut parts, body) = req.into_parts();
        // A body read whole goes on over the wire ([`wire`]), which takes
        // the methods the lean path takes: the response to HEAD has a length
        // but no body, and CONNECT asks for a tunnel.
        let wire_method =
            parts.method != http::Method::HEAD && parts.method != http::Method::CONNECT;
        let incoming = match body {
            RequestBody::Streamed(incoming)
                if limit > 0
                    && wire_method
                    && !incoming.is_end_stream()
                    && incoming.size_hint().exact().is_none_or(|n| n <= limit) =>
            {
                incoming
            }
            body => return Ok(Request::from_parts(parts, body)),
        };
        let mut held = conn.buffering(limit.max(buffering::CONNECTION_BUDGET));
        let paced = Paced::new(incoming, self.pace());
        let read = buffering::read_up_to(paced, limit, |bytes| held.take(bytes)).await;
        drop(held);
        let body = match read {
            Ok(Buffered::Whole(bytes)) => {
                // Framed by its length now, whatever framed it on the way in.
                parts.headers.remove(http::header::TRANSFER_ENCODING);
                parts
                    .headers
                    .insert(http::header::CONTENT_LENGTH, bytes.len().into());
                RequestBody::Read(bytes)
            }
            Ok(Buffered::Begun(read, rest)) => RequestBody::Begun(read, rest),
            Err(error) => {
                tracing::debug!(route = %route.name, %error, "the client's request body could not be read whole");
                let (abort, answer) = if error.is::<pacing::BodyTooSlow>() {
                    (ClientAbort::BodyTooSlow, ApiError::request_timeout())
                } else {
                    (
                        ClientAbort::BodyBroken,
                        ApiError::bad_request("Request body could not be read"),
                    )
                };
                route.series.client_abort(abort);
                return Err(answer);
            }
        };
        Ok(Request::from_parts(parts, body))
    }

    /// Sends a prepared request (headers already processed) to the route; the
    /// response head comes back as the upstream sent it.
    /// `path` is the normalised path; the upstream receives exactly it.
    /// `in_flight` counts the request against its client's bounds until the
    /// upstream exchange ends (with the response body).
    pub async fn forward<'r>(
        &self,
        route: &'r Route,
        mut parts: http::request::Parts,
        added: &headers::Added,
        incoming: RequestBody,
        path: &str,
        in_flight: InFlight,
    ) -> Result<(Response<Body>, &'r str), ForwardError<'r>> {
        // Only an empty body can be sent again to another upstream.
        let replayable = incoming.is_end_stream() && route.upstreams.len() > 1;
        let (whole, mut body) = self.outgoing(incoming, parts.version)?;
        let mut keep = Some(in_flight);
        parts.version = Version::HTTP_11;
        let original = parts.uri.path_and_query().cloned();
        let mut tried = Vec::new();
        loop {
            let index = self.pick(route, &tried).ok_or_else(ApiError::bad_gateway)?;
            tried.push(index);
            let upstream: &'r Upstream = &route.upstreams[index];
            aim(&mut parts, upstream, path, original.as_ref())?;
            let head = if replayable {
                parts.clone()
            } else {
                std::mem::replace(&mut parts, Request::new(()).into_parts().0)
            };
            let started = Instant::now();
            // Counts the client going away while the upstream is asked.
            let gone = GoneGuard(Some(&route.series));
            // Pinned where it is made and lent to the timeout, not moved
            // into it: a move of this future was a copy of it.
            let exchange = std::pin::pin!(self.exchange(
                upstream,
                head,
                added,
                whole.as_ref(),
                &mut body,
                &mut keep
            ));
            let result = tokio::time::timeout(route.timeout, exchange).await;
            gone.disarm();
            let failure = match answered(upstream, started, result) {
                Ok(response) => return Ok((response, upstream.label.as_str())),
                Err(failure) => failure,
            };
            match failure {
                Failure::ClientBody => route.series.client_abort(ClientAbort::BodyBroken),
                Failure::ClientTooSlow => route.series.client_abort(ClientAbort::BodyTooSlow),
                _ => {}
            }
            let may_retry = replayable && tried.len() < route.upstreams.len();
            let Some(error) = self.failed(route, upstream, failure, may_retry) else {
                continue;
            };
            return Err(ForwardError {
                error,
                upstream: Some(upstream.label.as_str()),
            });
        }
    }

    /// The request's body as [`Proxy::forward`] sends it on: read whole, to
    /// go with its head ([`wire`]), or as a body for hyper's client; refused
    /// when it is over `limits.max_body_bytes`.
    fn outgoing(
        &self,
        incoming: RequestBody,
        version: Version,
    ) -> Result<(Option<bytes::Bytes>, Option<Body>), ApiError> {
        let declared = incoming.declared();
        if declared.is_some_and(|n| n > self.limits.max_body_bytes) {
            // Answered first; over HTTP/2 the rest is read and thrown away.
            if let RequestBody::Streamed(incoming) = incoming {
                body::discard_rest_if_http2(version, incoming, 0, &self.limits);
            }
            return Err(ApiError::body_too_large());
        }
        // A body read whole with its head goes with hyper's client's
        // dispatch left out ([`wire`]).
        Ok(match incoming {
            RequestBody::Read(bytes) => (Some(bytes), None),
            RequestBody::Streamed(incoming) => (
                None,
                Some(self.request_body(incoming, declared.is_some(), version)),
            ),
            RequestBody::Begun(read, rest) => {
                let already = read.len() as u64;
                if already > self.limits.max_body_bytes {
                    body::discard_rest_if_http2(version, rest, already, &self.limits);
                    return Err(ApiError::body_too_large());
                }
                let rest = self.paced_body(rest, already, false, version);
                let resumed = Resumed {
                    read: Some(read),
                    rest,
                };
                (None, Some(body::boxed(resumed)))
            }
        })
    }

    /// One attempt at `upstream`: a body read whole goes with its head over
    /// the wire; any other with hyper's client (taken from `body`: an
    /// attempt after the first sends an empty one).
    async fn exchange(
        &self,
        upstream: &Upstream,
        head: http::request::Parts,
        added: &headers::Added,
        whole: Option<&bytes::Bytes>,
        body: &mut Option<Body>,
        keep: &mut Option<InFlight>,
    ) -> Result<Response<Body>, SendError> {
        match whole {
            Some(bytes) => {
                self.client
                    .send_whole(&upstream.endpoint, head, added, bytes.clone(), keep)
                    .await
            }
            None => {
                let mut head = head;
                added.append_to(&mut head.headers);
                let request_body = body.take().unwrap_or_else(body::empty);
                let request = Request::from_parts(head, request_body);
                // Boxed: hyper's exchange is the largest part of
                // this future, which every request, lean ones
                // included, would otherwise carry and copy at each
                // move (`memmove` under `benches/run --perf`).
                Box::pin(self.client.send(&upstream.endpoint, request, keep)).await
            }
        }
    }
}

/// A route's count of failed TLS handshakes with its `https://` upstreams,
/// with its name for the log line of each.
#[derive(Clone)]
pub(crate) struct TlsFailures {
    route: String,
    counter: prometheus::IntCounter,
}

impl TlsFailures {
    /// Counts and logs a failed handshake with `host`: the route, the
    /// upstream's host and the reason.
    pub(crate) fn count(&self, host: &str, reason: &str) {
        self.counter.inc();
        tracing::warn!(route = %self.route, upstream_host = %host, reason = %reason, "TLS handshake with the upstream failed");
    }
}

/// Points the request's head at `upstream`: its target for `path` (and the
/// client's query, from `original`) and its `Host`.
fn aim(
    parts: &mut http::request::Parts,
    upstream: &Upstream,
    path: &str,
    original: Option<&PathAndQuery>,
) -> Result<(), ApiError> {
    parts.uri = upstream
        .target(path, original)
        .map_err(|_| ApiError::bad_request("Invalid request path"))?
        .into();
    parts
        .headers
        .insert(http::header::HOST, upstream.host_header.clone());
    Ok(())
}

/// The response of an attempt that `upstream` answered (marking it up and
/// counting its time), or how the attempt failed.
fn answered(
    upstream: &Upstream,
    started: Instant,
    result: Result<Result<Response<Body>, SendError>, tokio::time::error::Elapsed>,
) -> Result<Response<Body>, Failure> {
    match result {
        // Nothing here asked to switch protocols (upgrades go through
        // the WebSocket module): a 101 passed on would leave the client
        // with a connection neither side can speak HTTP on.
        Ok(Ok(response)) if response.status() == http::StatusCode::SWITCHING_PROTOCOLS => {
            tracing::warn!(upstream = %upstream.label, "upstream switched protocols on a request that asked for no upgrade");
            Err(Failure::Other)
        }
        Ok(Ok(response)) => {
            upstream.down_until.store(0, Ordering::Relaxed);
            upstream.series.answered(started.elapsed());
            Ok(response)
        }
        Ok(Err(error)) => Err(classify(&error)),
        Err(_) => Err(Failure::Timeout),
    }
}

/// A proxied request's body: streamed from hyper's connection, read whole
/// (with its head by the lean path, [`crate::listener::h1fast`], or by
/// [`Proxy::buffer`]), or begun by [`Proxy::buffer`]: the part read, then
/// the rest, at its pace.
pub enum RequestBody {
    Streamed(hyper::body::Incoming),
    Read(bytes::Bytes),
    Begun(bytes::Bytes, Paced),
}

impl RequestBody {
    /// The length the client declared (hyper's), or read.
    fn declared(&self) -> Option<u64> {
        match self {
            RequestBody::Streamed(incoming) => incoming.size_hint().exact(),
            RequestBody::Read(bytes) => Some(bytes.len() as u64),
            RequestBody::Begun(read, rest) => rest
                .size_hint()
                .exact()
                .map(|n| n.saturating_add(read.len() as u64)),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Streamed(incoming) => incoming.is_end_stream(),
            RequestBody::Read(bytes) => bytes.is_empty(),
            RequestBody::Begun(..) => false,
        }
    }
}

/// Counts [`ClientAbort::Gone`] on its route when dropped armed: the client
/// went away while its request was with the upstream.
struct GoneGuard<'r>(Option<&'r RouteSeries>);

impl GoneGuard<'_> {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for GoneGuard<'_> {
    fn drop(&mut self) {
        if let Some(series) = self.0 {
            series.client_abort(ClientAbort::Gone);
        }
    }
}

/// A client body without a declared length passed `limits.max_body_bytes`.
#[derive(Debug)]
struct BodyTooLarge;

impl std::fmt::Display for BodyTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the client's request body is over the size limit")
    }
}

impl std::error::Error for BodyTooLarge {}

/// A client body of undeclared length, cut off at `limits.max_body_bytes`.
/// When cut off over HTTP/2, what is left is read and thrown away in the
/// background ([`body::discard_rest`]) rather than dropped, so the client
/// finishes its upload and reads the 413.
struct Capped {
    /// `None` once cut off.
    inner: Option<Paced>,
    read: u64,
    version: Version,
    limits: HttpLimits,
}

impl http_body::Body for Capped {
    type Data = bytes::Bytes;
    type Error = body::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, body::BoxError>>> {
        use std::task::Poll;
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(Some(Err(Box::new(BodyTooLarge))));
        };
        let frame = match std::pin::Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        if let Some(data) = frame.data_ref() {
            this.read += data.len() as u64;
            if this.read > this.limits.max_body_bytes {
                if let Some(rest) = this.inner.take() {
                    body::discard_rest_if_http2(this.version, rest, this.read, &this.limits);
                }
                return Poll::Ready(Some(Err(Box::new(BodyTooLarge))));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_some_and(|b| b.is_end_stream())
    }
}

fn classify(error: &SendError) -> Failure {
    match error {
        SendError::Connect(_) => return Failure::Connect,
        SendError::Handshake(e) => return Failure::Handshake(stream::handshake_reason(e)),
        SendError::Saturated => return Failure::Saturated,
        SendError::Request(_) | SendError::Wire(_) | SendError::Write(_) | SendError::Read(_) => {}
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if e.is::<BodyTooLarge>() {
            return Failure::BodyTooLarge;
        }
        if e.is::<pacing::BodyTooSlow>() {
            return Failure::ClientTooSlow;
        }
        if e.is::<body::ClientBodyError>() {
            return Failure::ClientBody;
        }
        // Over TLS 1.3 a client certificate the upstream refuses is told
        // by an alert after keygate's side of the handshake is done: it
        // arrives in place of the answer.
        if let Some(reason) = stream::tls_reason(e) {
            return Failure::Handshake(reason);
        }
        source = e.source();
    }
    tracing::warn!(error = %error, "upstream request failed");
    Failure::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(prefix: &str, public: bool) -> RouteSpec {
        RouteSpec {
            name: prefix.into(),
            prefix: prefix.into(),
            upstreams: vec!["http://127.0.0.1:1".parse().unwrap()],
            public,
            request_timeout: Duration::from_secs(1),
            openapi: None,
            quota: Default::default(),
            identity: Default::default(),
            audience: prefix.into(),
            upstream_tls: None,
        }
    }

    #[test]
    fn longest_prefix_wins() {
        let table = RouteTable::new(
            &[
                spec("/api/", false),
                spec("/api/noauth/", true),
                spec("/", false),
            ],
            &Metrics::new(),
        );
        assert_eq!(table.find("/api/noauth/x").unwrap().prefix, "/api/noauth/");
        assert_eq!(table.find("/api/devices").unwrap().prefix, "/api/");
        assert_eq!(table.find("/other").unwrap().prefix, "/");
        let table = RouteTable::new(&[spec("/api/", false)], &Metrics::new());
        assert!(table.find("/apix").is_none());
        assert!(table.find("/api").is_none());
    }

    #[test]
    fn upstream_uri_joins_base_path_path_and_query() {
        let upstream = Upstream::new(
            &"http://127.0.0.1:9000/base/".parse().unwrap(),
            None,
            &Metrics::new(),
        );
        assert_eq!(
            upstream.uri("/api/x", Some("a=1")).unwrap().to_string(),
            "http://127.0.0.1:9000/base/api/x?a=1"
        );
        let upstream = Upstream::new(
            &"http://127.0.0.1:9000".parse().unwrap(),
            None,
            &Metrics::new(),
        );
        assert_eq!(
            upstream.uri("/api/x", None).unwrap().to_string(),
            "http://127.0.0.1:9000/api/x"
        );
    }

    #[test]
    fn the_clients_target_is_sent_as_it_came_unless_normalising_or_a_base_path_changed_it() {
        let plain = Upstream::new(
            &"http://127.0.0.1:9000".parse().unwrap(),
            None,
            &Metrics::new(),
        );
        let based = Upstream::new(
            &"http://127.0.0.1:9000/base".parse().unwrap(),
            None,
            &Metrics::new(),
        );
        let target = |upstream: &Upstream, original: &str, path: &str| {
            let original: PathAndQuery = original.parse().unwrap();
            upstream.target(path, Some(&original)).unwrap().to_string()
        };
        assert_eq!(target(&plain, "/api/x?a=1&b", "/api/x"), "/api/x?a=1&b");
        assert_eq!(target(&plain, "/api/./x?a=1", "/api/x"), "/api/x?a=1");
        assert_eq!(target(&plain, "/api//x", "/api/x"), "/api/x");
        assert_eq!(target(&based, "/api/x?a=1", "/api/x"), "/base/api/x?a=1");
        assert_eq!(plain.target("/api/x", None).unwrap(), "/api/x");
    }

    #[tokio::test]
    async fn round_robin_skips_an_upstream_marked_down() {
        let mut s = spec("/api/", false);
        s.upstreams = vec![
            "http://127.0.0.1:1".parse().unwrap(),
            "http://127.0.0.1:2".parse().unwrap(),
        ];
        let table = RouteTable::new(&[s], &Metrics::new());
        let route = table.find("/api/x").unwrap();
        let settings = crate::config::load(&crate::config::Source {
            file: None,
            env: vec![],
        })
        .unwrap();
        let proxy = Proxy::new(&settings.proxy, &settings.limits, 2);
        let picks: Vec<_> = (0..4).map(|_| proxy.pick(route, &[]).unwrap()).collect();
        assert_eq!(picks, vec![0, 1, 0, 1]);
        route.upstreams[0]
            .down_until
            .store(proxy.now_ms() + 60_000, Ordering::Relaxed);
        let picks: Vec<_> = (0..4).map(|_| proxy.pick(route, &[]).unwrap()).collect();
        assert_eq!(picks, vec![1, 1, 1, 1]);
        route.upstreams[1]
            .down_until
            .store(proxy.now_ms() + 60_000, Ordering::Relaxed);
        assert!(proxy.pick(route, &[]).is_some(), "all down: still try one");
    }
}
