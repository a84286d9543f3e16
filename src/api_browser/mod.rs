//! The API browser: Swagger UI at `/swagger-ui.html` (assets built into the
//! binary) and the OpenAPI document at `/v3/api-docs`, which joins keygate's
//! own endpoints with the documents its upstreams publish.
//!
//! Upstream documents are fetched at start and every `api_browser.refresh`; the
//! last good copy is kept when an upstream is down or answers garbage, so one
//! broken upstream never breaks the page. How the documents are joined, and
//! how clashes resolve, is [`merge`]'s. A document at an `https://` URL is
//! fetched over TLS with its route's `upstream_tls`, as its requests are.
//!
//! The page sends the user's credential with its calls, so every call it makes
//! must stay on keygate's origin: the merged document names no server at all
//! (upstream `servers` at path and operation level, in callbacks and in links
//! are removed, as are `$ref`s to anything outside the document), and Swagger
//! UI then builds every URL on the page's own origin. The page's script checks
//! the origin again before it attaches a credential, and every response of the
//! browser carries a Content-Security-Policy that only allows keygate's origin.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, Uri, header};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::sync::watch;

mod merge;

use merge::{Clash, merge};

use crate::api::openapi;
use crate::body::{self, Body};
use crate::config::RouteSpec;
use crate::proxy::Routes;
use crate::proxy::stream::Endpoint;
use crate::tls_client::Connector;

/// The first wait before fetching a failed upstream document again.
const RETRY_FIRST: Duration = Duration::from_secs(1);

const PAGE: &str = include_str!("../../assets/swagger-ui.html");
/// The page's own script and style, served as files so that the policy needs
/// no `'unsafe-inline'`.
const SCRIPT: &str = include_str!("../../assets/api-browser.js");
const STYLE: &str = include_str!("../../assets/api-browser.css");
const SCRIPT_PATH: &str = "/swagger-ui/keygate-api-browser.js";
const STYLE_PATH: &str = "/swagger-ui/keygate-api-browser.css";

/// The Swagger UI files the page loads; nothing else of the distribution
/// (its own index page, initializer and OAuth redirect page) is served.
const SWAGGER_FILES: &[&str] = &[
    "swagger-ui-bundle.js",
    "swagger-ui.css",
    "favicon-32x32.png",
    "favicon-16x16.png",
];

/// The policy of every response of the browser: scripts, styles, calls and
/// frames from keygate's origin only. Swagger UI's stylesheet draws its icons
/// from `data:` images; its React components set styles through the DOM,
/// which the policy allows without `'unsafe-inline'`.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
    style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; \
    object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// An upstream document source: the route it belongs to and where to fetch it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub route: String,
    pub prefix: String,
    pub public: bool,
    pub url: Uri,
}

impl Source {
    /// The sources of the routes that publish a document, in route order.
    fn of(routes: &[RouteSpec]) -> Vec<Source> {
        routes
            .iter()
            .filter_map(|route| {
                Some(Source {
                    route: route.name.clone(),
                    prefix: route.prefix.clone(),
                    public: route.public,
                    url: route.openapi.clone()?,
                })
            })
            .collect()
    }

    /// [`Source::of`], each with its route's TLS.
    fn with_tls(routes: &[RouteSpec]) -> Vec<(Source, Option<&Connector>)> {
        let tls = routes
            .iter()
            .filter(|route| route.openapi.is_some())
            .map(|route| route.upstream_tls.as_ref());
        Source::of(routes).into_iter().zip(tls).collect()
    }
}

/// The last good document of one source, and its version: a number that
/// changes whenever a fetch brings a different document.
struct Fetched {
    source: Source,
    document: Value,
    version: u64,
}

#[derive(Default)]
struct Documents {
    fetched: Vec<Fetched>,
    next_version: u64,
    /// The clashes of the current join, each with the version of the
    /// document it came from: logged when first seen, so an unchanged
    /// document does not log its clashes again on every refresh.
    reported: BTreeSet<(u64, Clash)>,
}

pub struct ApiBrowser {
    own: Value,
    /// The routes in force, shared with the request path: the documents
    /// follow a reload.
    routes: Arc<Routes>,
    documents: Mutex<Documents>,
    /// The merged document, serialised once per change.
    merged: RwLock<Bytes>,
    assets: Arc<utoipa_swagger_ui::Config<'static>>,
}

impl ApiBrowser {
    pub fn new(routes: Arc<Routes>) -> ApiBrowser {
        let own = openapi::document();
        let merged = RwLock::new(Bytes::from(merge(&own, &[]).document.to_string()));
        ApiBrowser {
            own,
            routes,
            documents: Mutex::new(Documents::default()),
            merged,
            assets: Arc::new(utoipa_swagger_ui::Config::new(["/v3/api-docs"])),
        }
    }

    /// Does keygate answer this path as part of the browser?
    pub fn owns(path: &str) -> bool {
        path == "/swagger-ui.html"
            || path == "/v3/api-docs"
            || path == "/swagger-ui"
            || path.starts_with("/swagger-ui/")
    }

    pub fn handle(&self, path: &str) -> Response<Body> {
        let mut response = match path {
            "/swagger-ui.html" => respond(
                "text/html; charset=utf-8",
                Bytes::from_static(PAGE.as_bytes()),
            ),
            // Where Swagger UI usually lives: its own page there would log
            // in with Basic authentication, so keygate's page answers instead.
            "/swagger-ui" | "/swagger-ui/" | "/swagger-ui/index.html" => redirect_to_page(),
            SCRIPT_PATH => respond(
                "application/javascript",
                Bytes::from_static(SCRIPT.as_bytes()),
            ),
            STYLE_PATH => respond("text/css", Bytes::from_static(STYLE.as_bytes())),
            "/v3/api-docs" => {
                let doc = self.merged.read().map(|d| d.clone()).unwrap_or_default();
                respond("application/json", doc)
            }
            _ => {
                let file = path.trim_start_matches("/swagger-ui/");
                let found = SWAGGER_FILES
                    .contains(&file)
                    .then(|| utoipa_swagger_ui::serve(file, self.assets.clone()));
                match found {
                    Some(Ok(Some(found))) => {
                        respond(content_type(file), Bytes::from(found.bytes.into_owned()))
                    }
                    _ => crate::error::ApiError::not_found().into_response(),
                }
            }
        };
        protect(response.headers_mut());
        response
    }

    /// Fetches the document of every route that publishes one now, then every
    /// `refresh` and whenever the routes are reloaded, until shutdown.
    pub async fn refresh_loop(
        self: Arc<Self>,
        refresh: Duration,
        timeout: Duration,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut reloaded = self.routes.subscribe();
        // After a failed fetch the next round comes sooner, doubling up to the
        // refresh interval: an upstream that starts after keygate (a common
        // order in a pod) is joined within seconds, not a whole interval later.
        let mut retry = RETRY_FIRST;
        loop {
            // Documents of removed routes leave the page at once, before the
            // new routes' documents are fetched.
            self.rebuild();
            let mut failed = false;
            let routes = self.routes.load();
            for (source, tls) in Source::with_tls(routes.specs()) {
                match fetch(&source.url, tls, timeout).await {
                    Ok(document) => self.keep(source, document),
                    Err(error) => {
                        failed = true;
                        tracing::warn!(
                            route = %source.route,
                            url = %source.url,
                            %error,
                            "upstream OpenAPI document unavailable; keeping the last good copy"
                        );
                    }
                }
            }
            self.rebuild();
            let wait = if failed {
                let wait = retry.min(refresh);
                retry = (retry * 2).min(refresh);
                wait
            } else {
                retry = RETRY_FIRST;
                refresh
            };
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = reloaded.changed() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Keeps a fetched document as its source's last good copy; a document
    /// that differs from the previous copy gets a new version.
    fn keep(&self, source: Source, document: Value) {
        let Ok(mut documents) = self.documents.lock() else {
            return;
        };
        let documents = &mut *documents;
        match documents.fetched.iter_mut().find(|f| f.source == source) {
            Some(kept) if kept.document == document => {}
            Some(kept) => {
                documents.next_version += 1;
                kept.document = document;
                kept.version = documents.next_version;
            }
            None => {
                documents.next_version += 1;
                documents.fetched.push(Fetched {
                    source,
                    document,
                    version: documents.next_version,
                });
            }
        }
    }

    /// Joins keygate's document with the kept documents of the routes in
    /// force (dropping those of routes no longer configured), logs the
    /// clashes not logged for those document versions yet, and returns them.
    fn rebuild(&self) -> Vec<Clash> {
        let sources = Source::of(self.routes.load().specs());
        let Ok(mut documents) = self.documents.lock() else {
            return Vec::new();
        };
        documents.fetched.retain(|f| sources.contains(&f.source));
        // In route order, whatever order they were fetched in.
        let mut current: Vec<&Fetched> = documents.fetched.iter().collect();
        current.sort_by_key(|f| sources.iter().position(|s| *s == f.source));
        let joined: Vec<(Source, Value)> = current
            .iter()
            .map(|f| (f.source.clone(), f.document.clone()))
            .collect();
        let versions: Vec<u64> = current.iter().map(|f| f.version).collect();
        let merged = merge(&self.own, &joined);
        let clashes: BTreeSet<(u64, Clash)> = merged
            .clashes
            .into_iter()
            .map(|(upstream, clash)| (versions[upstream], clash))
            .collect();
        let new: Vec<Clash> = clashes
            .difference(&documents.reported)
            .map(|(_, clash)| clash.clone())
            .collect();
        new.iter().for_each(log_clash);
        documents.reported = clashes;
        drop(documents);
        if let Ok(mut slot) = self.merged.write() {
            *slot = Bytes::from(merged.document.to_string());
        }
        new
    }
}

/// Logs a clash of the current join (once per document version, the caller
/// decides).
fn log_clash(clash: &Clash) {
    match clash {
        Clash::Schema {
            route,
            name,
            renamed,
        } => {
            tracing::warn!(schema = %name, route = %route, renamed = %renamed, "OpenAPI schema name clash; renamed the upstream's schema")
        }
        Clash::Path { route, path } => {
            tracing::warn!(path = %path, route = %route, "OpenAPI path already documented; keeping the first")
        }
    }
}

/// A redirect to keygate's page.
fn redirect_to_page() -> Response<Body> {
    let mut response = Response::new(body::empty());
    *response.status_mut() = StatusCode::FOUND;
    response.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_static("/swagger-ui.html"),
    );
    response
}

/// The headers every response of the browser carries: the content policy,
/// no framing, no type sniffing, no referrer.
fn protect(headers: &mut http::HeaderMap) {
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
}

fn respond(content_type: &'static str, bytes: Bytes) -> Response<Body> {
    let mut response = Response::new(body::full(bytes));
    *response.status_mut() = StatusCode::OK;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn content_type(file: &str) -> &'static str {
    match file.rsplit('.').next() {
        Some("js") => "application/javascript",
        Some("css") => "text/css",
        Some("png") => "image/png",
        Some("html") => "text/html; charset=utf-8",
        Some("json") | Some("map") => "application/json",
        _ => "application/octet-stream",
    }
}

/// The document at `url` (over TLS with `tls` when it is `https://`),
/// within `timeout`, on a connection of its own.
async fn fetch(url: &Uri, tls: Option<&Connector>, timeout: Duration) -> Result<Value, String> {
    let work = async {
        let authority = url.authority().ok_or("the URL has no host")?;
        let https = url.scheme() == Some(&http::uri::Scheme::HTTPS);
        let endpoint = Endpoint::new(authority.clone(), https, tls);
        let stream = endpoint.open(timeout).await.map_err(|e| match e {
            crate::proxy::stream::OpenError::Connect(e) => format!("connecting: {e}"),
            crate::proxy::stream::OpenError::Handshake(e) => format!(
                "TLS handshake: {}",
                crate::proxy::stream::handshake_reason(&e)
            ),
        })?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        // Driven beside the exchange; stopped with it.
        let driver = AbortOnDrop(tokio::spawn(connection));
        let default_port = if https { 443 } else { 80 };
        let host = match authority.port_u16() {
            Some(port) if port == default_port => authority.host(),
            _ => authority.as_str(),
        };
        let target = url.path_and_query().map_or("/", |p| p.as_str());
        let request = http::Request::get(target)
            .header(header::HOST, host)
            .header(header::ACCEPT, "application/json")
            .body(http_body_util::Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("status {}", response.status()));
        }
        let bytes = http_body_util::Limited::new(response.into_body(), 8 * 1024 * 1024)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        drop(driver);
        let doc: Value = serde_json::from_slice(&bytes).map_err(|e| format!("not JSON: {e}"))?;
        if !doc.get("paths").is_some_and(Value::is_object) {
            return Err("not an OpenAPI document (no paths)".into());
        }
        Ok(doc)
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| "timed out".to_string())?
}

/// A task stopped when this is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Metrics;
    use serde_json::json;

    #[test]
    fn every_browser_response_carries_the_content_policy_and_frame_protection() {
        let browser = ApiBrowser::new(Arc::new(Routes::new(&[], Arc::new(Metrics::new()))));
        for path in [
            "/swagger-ui.html",
            SCRIPT_PATH,
            STYLE_PATH,
            "/swagger-ui/swagger-ui-bundle.js",
            "/swagger-ui/swagger-ui.css",
            "/v3/api-docs",
            "/swagger-ui/nope.js",
        ] {
            let response = browser.handle(path);
            let headers = response.headers();
            assert_eq!(
                headers[header::CONTENT_SECURITY_POLICY],
                CONTENT_SECURITY_POLICY,
                "{path}"
            );
            assert_eq!(headers[header::X_FRAME_OPTIONS], "DENY", "{path}");
            assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{path}");
            assert_eq!(headers[header::REFERRER_POLICY], "no-referrer", "{path}");
        }
        for directive in [
            "default-src 'self'",
            "script-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
            "object-src 'none'",
            "base-uri 'none'",
            "form-action 'self'",
        ] {
            assert!(
                CONTENT_SECURITY_POLICY.split("; ").any(|d| d == directive),
                "{directive}"
            );
        }
        assert!(!CONTENT_SECURITY_POLICY.contains("unsafe-"));
    }

    #[test]
    fn the_page_has_no_inline_script_or_style() {
        let lower = PAGE.to_ascii_lowercase();
        assert_eq!(lower.matches("<script").count(), 2);
        assert_eq!(
            lower.matches("<script src=").count(),
            2,
            "every script is a file"
        );
        assert!(!lower.contains("<style") && !lower.contains("style="));
        let handlers = lower.split(|c: char| c.is_whitespace()).filter(|word| {
            word.strip_prefix("on")
                .and_then(|rest| rest.split_once('='))
                .is_some_and(|(name, _)| name.chars().all(|c| c.is_ascii_alphabetic()))
        });
        assert_eq!(handlers.count(), 0, "no inline event handler");
        assert!(PAGE.contains(SCRIPT_PATH) && PAGE.contains(STYLE_PATH));
    }

    #[test]
    fn swagger_ui_pages_without_keygates_credential_rule_are_not_served() {
        let browser = ApiBrowser::new(Arc::new(Routes::new(&[], Arc::new(Metrics::new()))));
        for path in ["/swagger-ui", "/swagger-ui/", "/swagger-ui/index.html"] {
            let response = browser.handle(path);
            assert_eq!(response.status(), StatusCode::FOUND, "{path}");
            assert_eq!(
                response.headers()[header::LOCATION],
                "/swagger-ui.html",
                "{path}"
            );
            assert_eq!(
                response.headers()[header::CONTENT_SECURITY_POLICY],
                CONTENT_SECURITY_POLICY
            );
        }
        for path in [
            "/swagger-ui/swagger-initializer.js",
            "/swagger-ui/oauth2-redirect.html",
            "/swagger-ui/oauth2-redirect.js",
            "/swagger-ui/index.css",
        ] {
            assert_eq!(
                browser.handle(path).status(),
                StatusCode::NOT_FOUND,
                "{path}"
            );
        }
        assert!(ApiBrowser::owns("/swagger-ui") && ApiBrowser::owns("/swagger-ui/"));
    }

    /// A log subscriber that writes into a buffer, for the duration of `run`.
    fn logged(run: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, run);
        String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap()
    }

    fn route(name: &str, prefix: &str, openapi: Option<&str>) -> RouteSpec {
        RouteSpec {
            name: name.into(),
            prefix: prefix.into(),
            upstreams: vec!["http://127.0.0.1:1".parse().unwrap()],
            public: false,
            request_timeout: Duration::from_secs(1),
            openapi: openapi.map(|u| u.parse().unwrap()),
            quota: Default::default(),
            identity: Default::default(),
            audience: name.into(),
            upstream_tls: None,
        }
    }

    fn document_of(browser: &ApiBrowser) -> Value {
        serde_json::from_slice(&browser.merged.read().unwrap()).unwrap()
    }

    #[test]
    fn a_clash_is_logged_once_per_document_version() {
        let routes = Arc::new(Routes::new(
            &[route(
                "entities",
                "/api/",
                Some("http://127.0.0.1:1/v3/api-docs"),
            )],
            Arc::new(Metrics::new()),
        ));
        let browser = ApiBrowser::new(routes.clone());
        let source = Source::of(routes.load().specs()).remove(0);
        // Two schemas keygate's own document already defines differently,
        // and a path keygate already documents.
        let document = |version: &str| {
            json!({
                "info": {"version": version},
                "paths": {"/api/auth/login": {"post": {}}, "/api/device": {"get": {}}},
                "components": {"schemas": {"User": {"type": "string"}, "ErrorResponse": {"type": "string"}}}
            })
        };
        let mut text = String::new();
        for _refresh in 0..5 {
            text += &logged(|| {
                browser.keep(source.clone(), document("1"));
                browser.rebuild();
            });
        }
        assert_eq!(
            text.matches("OpenAPI schema name clash").count(),
            2,
            "{text}"
        );
        assert_eq!(
            text.matches("OpenAPI path already documented").count(),
            1,
            "{text}"
        );
        assert!(
            text.contains("schema=User ") && text.contains("renamed=User_entities"),
            "{text}"
        );
        assert!(document_of(&browser)["components"]["schemas"]["User_entities"].is_object());

        // A new version of the document: its clashes are logged again, once.
        let mut text = String::new();
        for _refresh in 0..3 {
            text += &logged(|| {
                browser.keep(source.clone(), document("2"));
                browser.rebuild();
            });
        }
        assert_eq!(
            text.matches("OpenAPI schema name clash").count(),
            2,
            "{text}"
        );
        assert_eq!(
            text.matches("OpenAPI path already documented").count(),
            1,
            "{text}"
        );
    }

    #[test]
    fn documents_follow_the_routes_in_force() {
        let with_docs = [
            route("a", "/a/", Some("http://127.0.0.1:1/a-docs")),
            route("b", "/b/", Some("http://127.0.0.1:1/b-docs")),
        ];
        let routes = Arc::new(Routes::new(&with_docs, Arc::new(Metrics::new())));
        let browser = ApiBrowser::new(routes.clone());
        let sources = Source::of(routes.load().specs());
        for (source, path) in sources.into_iter().zip(["/a/x", "/b/x"]) {
            browser.keep(source, json!({"paths": {path: {"get": {}}}}));
        }
        browser.rebuild();
        let paths = &document_of(&browser)["paths"];
        assert!(paths.get("/a/x").is_some() && paths.get("/b/x").is_some());

        // Route b is removed, route c added; c's document is not fetched yet.
        routes.replace(&[
            with_docs[0].clone(),
            route("c", "/c/", Some("http://127.0.0.1:1/c-docs")),
        ]);
        browser.rebuild();
        let paths = &document_of(&browser)["paths"];
        assert!(paths.get("/a/x").is_some(), "a stays");
        assert!(paths.get("/b/x").is_none(), "b left with its route");
        let c = Source::of(routes.load().specs()).remove(1);
        browser.keep(c, json!({"paths": {"/c/x": {"get": {}}}}));
        browser.rebuild();
        assert!(document_of(&browser)["paths"].get("/c/x").is_some());

        // A route made public is a new source: its document is fetched
        // again, and no path keeps the requirement of the old route.
        let mut public = with_docs[0].clone();
        public.public = true;
        routes.replace(&[public]);
        browser.rebuild();
        assert!(
            document_of(&browser)["paths"].get("/a/x").is_none(),
            "refetched as a new source"
        );
    }

    #[test]
    fn swagger_ui_assets_are_built_in() {
        let browser = ApiBrowser::new(Arc::new(Routes::new(&[], Arc::new(Metrics::new()))));
        for path in [
            "/swagger-ui.html",
            "/swagger-ui/swagger-ui-bundle.js",
            "/swagger-ui/swagger-ui.css",
            "/v3/api-docs",
        ] {
            assert_eq!(browser.handle(path).status(), StatusCode::OK, "{path}");
        }
        assert_eq!(
            browser.handle("/swagger-ui/nope.js").status(),
            StatusCode::NOT_FOUND
        );
    }
}
