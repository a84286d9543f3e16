//! Shared end-to-end harness: the real server on port 0, a recording upstream on
//! loopback, and clients that trust the generated development CA.
#![allow(dead_code)]

pub mod oidc;
pub mod pgbouncer;
pub mod platform;
pub mod provider;
pub mod shared_redis;
pub mod smtp;
pub mod tls_postgres;
pub mod tls_redis;
pub mod tls_upstream;
pub mod totp;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use keygate::accounts::{self, NewUser};
use keygate::config::{self, Source};
use keygate::decision::Rules;
use keygate::identity::Authority;
use keygate::server::{self, Running, StartOptions};
use keygate::store::{SessionRecord, UserRecord};
use tokio::net::TcpListener;
use uuid::Uuid;

pub const PASSWORD: &str = "correct-horse-battery";

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path_and_query: String,
    pub headers: HeaderMap,
    pub body_len: usize,
}

/// A loopback upstream that records every request it receives. A path with
/// `/slow` answers after two seconds (`?ms=N`: after N ms); everything else
/// at once with the body length.
pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Recorded>>>,
    /// Requests whose head arrived, counted before any is answered (a slow
    /// one is recorded in `seen` only once answered).
    pub arrived: Arc<std::sync::atomic::AtomicUsize>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Upstream {
    pub async fn start() -> Upstream {
        Upstream::start_at("127.0.0.1:0".parse().unwrap()).await
    }

    /// Starts on `addr`, which may be one a stopped upstream just left.
    pub async fn start_at(addr: SocketAddr) -> Upstream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        socket.bind(addr).unwrap();
        let listener = socket.listen(1024).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Recorded>>> = Arc::default();
        let record = seen.clone();
        let arrived: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let arriving = arrived.clone();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut accepting = stopped.clone();
        tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = accepting.changed() => return,
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => stream,
                        Err(_) => continue,
                    },
                };
                let record = record.clone();
                let arriving = arriving.clone();
                let mut stopped = stopped.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let record = record.clone();
                        arriving.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        async move { Ok::<_, std::convert::Infallible>(answer(req, record).await) }
                    });
                    let builder = auto::Builder::new(TokioExecutor::new());
                    let serving = builder.serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        _ = serving => {}
                        _ = stopped.changed() => {}
                    }
                });
            }
        });
        Upstream {
            addr,
            seen,
            arrived,
            stop,
        }
    }

    /// Stops at once, as a killed process would: the listener closes and every
    /// open connection is dropped mid-request.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.seen.lock().unwrap().clone()
    }

    pub fn last(&self) -> Recorded {
        self.requests().pop().expect("the upstream saw a request")
    }

    /// The last request, which must be the one to `path_and_query` (not an
    /// earlier one, when the latest was never forwarded).
    pub fn last_to(&self, path_and_query: &str) -> Recorded {
        let last = self.last();
        assert_eq!(
            last.path_and_query, path_and_query,
            "the upstream's last request"
        );
        last
    }

    /// How many requests have arrived so far, answered or not.
    pub fn arrived(&self) -> usize {
        self.arrived.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How many requests for a 1 MiB answer (`/big`) it has received.
    pub fn big_answers(&self) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.path_and_query.contains("/big"))
            .count()
    }
}

async fn answer(
    req: Request<Incoming>,
    record: Arc<Mutex<Vec<Recorded>>>,
) -> Response<Full<Bytes>> {
    let (parts, mut body) = req.into_parts();
    let mut body_len = 0;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => body_len += frame.data_ref().map_or(0, |d| d.len()),
            Err(_) => break,
        }
    }
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    if path_and_query.contains("/slow") {
        let ms = parts
            .uri
            .query()
            .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("ms=")))
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(2000);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    record.lock().unwrap().push(Recorded {
        method: parts.method.to_string(),
        path_and_query: path_and_query.clone(),
        headers: parts.headers,
        body_len,
    });
    if path_and_query.contains("/big") {
        // 1 MiB, for clients that never read what they asked for.
        return Response::new(Full::new(Bytes::from(vec![b'x'; 1 << 20])));
    }
    let body = serde_json::json!({ "path": path_and_query, "bodyLength": body_len }).to_string();
    Response::builder()
        .header("content-type", "application/json")
        .header("connection", "x-upstream-private")
        .header("x-upstream-private", "hop")
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// An upstream that publishes an OpenAPI document at `/v3/api-docs` (which
/// the test may replace while it runs) and counts how often it was fetched;
/// every other path answers `{"path": ...}`.
pub struct DocumentUpstream {
    pub addr: SocketAddr,
    document: Arc<Mutex<serde_json::Value>>,
    fetches: Arc<std::sync::atomic::AtomicUsize>,
}

impl DocumentUpstream {
    pub async fn start(document: serde_json::Value) -> DocumentUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let document = Arc::new(Mutex::new(document));
        let fetches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (served, counted) = (document.clone(), fetches.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (served, counted) = (served.clone(), counted.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let body = if req.uri().path() == "/v3/api-docs" {
                            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            served.lock().unwrap().to_string()
                        } else {
                            serde_json::json!({ "path": req.uri().path() }).to_string()
                        };
                        async move {
                            Ok::<_, std::convert::Infallible>(
                                Response::builder()
                                    .header("content-type", "application/json")
                                    .body(Full::new(Bytes::from(body)))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        DocumentUpstream {
            addr,
            document,
            fetches,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Publishes another document from now on.
    pub fn publish(&self, document: serde_json::Value) {
        *self.document.lock().unwrap() = document;
    }

    /// How many times the document was fetched.
    pub fn fetches(&self) -> usize {
        self.fetches.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits (bounded) until the document was fetched at least `count` times.
    pub async fn wait_for_fetches(&self, count: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while self.fetches() < count {
            assert!(
                std::time::Instant::now() < deadline,
                "the document was fetched {} times, expected {count}",
                self.fetches()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// How a client reaches keygate over HTTPS. A rule's test runs its one body
/// over each of [`WIRES`]: HTTP/1.1 takes the lean path (the default for
/// HTTP/1.1 clients), HTTP/2 hyper's driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    Http1,
    Http2,
}

/// Both wires, for `for wire in WIRES { ... }`.
pub const WIRES: [Wire; 2] = [Wire::Http1, Wire::Http2];

impl Wire {
    /// The version a response over this wire must carry.
    pub fn version(self) -> http::Version {
        match self {
            Wire::Http1 => http::Version::HTTP_11,
            Wire::Http2 => http::Version::HTTP_2,
        }
    }
}

/// What the lean path has left to hyper's so far, by reason: the series of
/// `keygate_fast_path_declined_total`. A proxied HTTP/1.1 request that
/// arrives over HTTP/1.1 and adds nothing here was taken by the lean path
/// (which is on by default); HTTP/2 never reaches it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Declines(std::collections::BTreeMap<String, u64>);

impl Declines {
    /// Reads the series from a metrics exposition.
    pub fn of(metrics: &str) -> Declines {
        let prefix = "keygate_fast_path_declined_total{reason=\"";
        Declines(
            metrics
                .lines()
                .filter_map(|line| line.strip_prefix(prefix))
                .filter_map(|rest| {
                    let (reason, value) = rest.split_once("\"} ")?;
                    Some((reason.to_owned(), value.parse::<f64>().ok()? as u64))
                })
                .collect(),
        )
    }

    /// The declines since `earlier`, by reason, leaving out reasons that did
    /// not grow.
    pub fn since(&self, earlier: &Declines) -> Declines {
        Declines(
            self.0
                .iter()
                .map(|(reason, n)| {
                    let before = earlier.0.get(reason).copied().unwrap_or(0);
                    (reason.clone(), n.saturating_sub(before))
                })
                .filter(|(_, n)| *n > 0)
                .collect(),
        )
    }

    /// How many were declined for `reason`.
    pub fn of_reason(&self, reason: &str) -> u64 {
        self.0.get(reason).copied().unwrap_or(0)
    }
}

/// A running gateway with its data in a temporary directory.
pub struct Gateway {
    pub running: Running,
    pub dir: tempfile::TempDir,
    pub ca_pem: Vec<u8>,
}

impl Gateway {
    /// Starts keygate with `/api/` (authenticated) and `/api/noauth/` (public)
    /// routed to `upstream`, plus `extra` TOML appended to the config.
    pub async fn start(upstream: &str, extra: &str) -> Gateway {
        Gateway::start_on(upstream, extra, None).await
    }

    /// Like [`Gateway::start`], on the given store URL (default: SQLite in the
    /// gateway's own directory).
    pub async fn start_on(upstream: &str, extra: &str, store_url: Option<&str>) -> Gateway {
        Gateway::start_deciding(upstream, extra, store_url, Rules::default()).await
    }

    /// Like [`Gateway::start`], with `rules` added to the one decision
    /// every driver asks.
    pub async fn start_with_rules(upstream: &str, extra: &str, rules: Rules) -> Gateway {
        Gateway::start_deciding(upstream, extra, None, rules).await
    }

    async fn start_deciding(
        upstream: &str,
        extra: &str,
        store_url: Option<&str>,
        rules: Rules,
    ) -> Gateway {
        let routes = format!(
            r#"
[[route]]
name = "api"
prefix = "/api/"
upstreams = ["{upstream}"]
[[route]]
name = "noauth"
prefix = "/api/noauth/"
upstreams = ["{upstream}"]
public = true
[[route]]
name = "slow"
prefix = "/api/slow"
upstreams = ["{upstream}"]
request_timeout = "300ms"
"#
        );
        Gateway::launch(&routes, extra, store_url, rules).await
    }

    /// Starts keygate with only the routes `config` has (and the rest of
    /// [`Gateway::start`]'s settings): a documented route table, as given.
    pub async fn start_with_routes(config: &str) -> Gateway {
        Gateway::launch("", config, None, Rules::default()).await
    }

    async fn launch(routes: &str, extra: &str, store_url: Option<&str>, rules: Rules) -> Gateway {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().display().to_string();
        let store_url = store_url
            .map(str::to_owned)
            .unwrap_or_else(|| format!("sqlite://{data}/keygate.db"));
        let text = format!(
            r#"
[server]
data_dir = "{data}"
shutdown_grace = "2s"
[listen]
https = "127.0.0.1:0"
http = "127.0.0.1:0"
admin = "127.0.0.1:0"
[store]
url = "{store_url}"
[proxy]
connect_timeout = "500ms"
upstream_retry_after = "1s"
[limits]
max_body_bytes = 2097152
max_header_bytes = 8192
"#
        );
        let path = dir.path().join("keygate.toml");
        std::fs::write(&path, merge_toml(&merge_toml(&text, routes), extra)).unwrap();
        let settings = config::load(&Source {
            file: Some(&path),
            env: vec![],
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let running = server::start(
            settings,
            StartOptions {
                bootstrap_password: Some(PASSWORD.into()),
                rules,
            },
        )
        .await
        .unwrap();
        let ca_pem = std::fs::read(dir.path().join("dev-ca.pem")).unwrap_or_default();
        Gateway {
            running,
            dir,
            ca_pem,
        }
    }

    pub fn https(&self, path: &str) -> String {
        format!(
            "https://localhost:{}{path}",
            self.running.https.unwrap().port()
        )
    }

    pub fn http(&self, path: &str) -> String {
        format!(
            "http://127.0.0.1:{}{path}",
            self.running.http.unwrap().port()
        )
    }

    pub fn admin(&self, path: &str) -> String {
        format!(
            "http://127.0.0.1:{}{path}",
            self.running.admin.unwrap().port()
        )
    }

    /// `POST /api/auth/login` over HTTPS.
    pub async fn login(&self, username: &str, password: &str) -> reqwest::Response {
        self.login_at(self.https("/api/auth/login"), username, password)
            .await
    }

    /// `POST` of a login body to `url` (another listener, another endpoint).
    pub async fn login_at(&self, url: String, username: &str, password: &str) -> reqwest::Response {
        self.client()
            .post(url)
            .json(&serde_json::json!({ "username": username, "password": password }))
            .send()
            .await
            .unwrap()
    }

    /// A client that trusts the development CA.
    pub fn client(&self) -> reqwest::Client {
        self.client_waiting(Duration::from_secs(10))
    }

    /// A client that trusts the development CA and speaks `wire` over
    /// HTTPS: HTTP/1.1 reaches the lean path, HTTP/2 hyper's driver.
    pub fn client_over(&self, wire: Wire) -> reqwest::Client {
        let builder = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&self.ca_pem).unwrap())
            .resolve("localhost", SocketAddr::from(([127, 0, 0, 1], 0)))
            .timeout(Duration::from_secs(10));
        match wire {
            Wire::Http1 => builder.http1_only(),
            Wire::Http2 => builder,
        }
        .build()
        .unwrap()
    }

    /// A client that trusts the development CA and waits up to `timeout`
    /// for each answer (a queue of work the test builds on purpose).
    pub fn client_waiting(&self, timeout: Duration) -> reqwest::Client {
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&self.ca_pem).unwrap())
            .resolve("localhost", SocketAddr::from(([127, 0, 0, 1], 0)))
            .timeout(timeout)
            .build()
            .unwrap()
    }

    pub async fn user(&self, email: &str, authority: Authority) -> UserRecord {
        let tenant = (authority != Authority::SysAdmin).then(Uuid::new_v4);
        let customer = (authority == Authority::CustomerUser).then(Uuid::new_v4);
        let new = NewUser {
            email: email.into(),
            authority,
            tenant_id: tenant,
            customer_id: customer,
            first_name: "Test".into(),
            last_name: String::new(),
        };
        accounts::create_user(
            &self.running.store,
            new,
            PASSWORD.into(),
            &Default::default(),
        )
        .await
        .unwrap()
    }

    /// Creates a key for `user`; returns (key id, value).
    pub async fn api_key(&self, user: &UserRecord, expiration_time: i64) -> (Uuid, String) {
        let created = accounts::create_api_key(
            &self.running.store,
            user,
            "tb_",
            "test key",
            expiration_time,
            true,
        )
        .await
        .unwrap();
        (created.record.id, created.value.expose().to_string())
    }

    /// Issues an access token in a new stored session; returns (session id, token).
    pub async fn access_token(&self, user: &UserRecord) -> (Uuid, String) {
        let session = SessionRecord::open(user.id, keygate::clock::now_ms(), String::new());
        self.running.store.insert_session(&session).await.unwrap();
        let keys = self.running.app.authenticator().token_keys();
        let signed = keys
            .sign_access(user, session.id, keygate::clock::now_secs())
            .unwrap();
        (session.id, signed.token)
    }

    /// What the lean path has declined so far ([`Declines`]).
    pub async fn declines(&self) -> Declines {
        Declines::of(&self.metrics().await)
    }

    /// Asserts that since `before` the lean path declined nothing but
    /// requests for `allowed` reasons (`not_proxied`: keygate's own
    /// endpoints, which hyper's path answers): every proxied HTTP/1.1
    /// request in between was the lean path's. First a probe shows that the
    /// lean path reads this gateway's HTTP/1.1 requests at all: a `HEAD`
    /// (which it leaves to hyper's) must be counted, so a lean path that is
    /// off or a renamed metric cannot make this pass.
    pub async fn assert_lean_path_took(&self, before: &Declines, allowed: &[&str], what: &str) {
        let probe = self
            .client_over(Wire::Http1)
            .head(self.https("/lean-path-probe"))
            .send()
            .await
            .unwrap();
        assert_eq!(probe.version(), http::Version::HTTP_11);
        let mut declined = self.declines().await.since(before);
        let probes = declined.0.entry("method".to_owned()).or_default();
        assert!(
            *probes >= 1,
            "{what}: the lean path did not count the probe's HEAD: is it on?"
        );
        *probes -= 1;
        let unexpected: Vec<(String, u64)> = declined
            .0
            .into_iter()
            .filter(|(reason, n)| *n > 0 && !allowed.contains(&reason.as_str()))
            .collect();
        assert!(
            unexpected.is_empty(),
            "{what}: the lean path left requests to hyper's: {unexpected:?}"
        );
    }

    pub async fn metrics(&self) -> String {
        reqwest::get(self.admin("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

/// The real `keygate serve` binary, its stderr (JSON log) going to a file.
pub struct Process {
    pub child: std::process::Child,
    pub https: u16,
    pub http: u16,
    pub admin: u16,
    pub log: std::path::PathBuf,
}

/// A test that fails never leaves its server behind.
impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Process {
    /// Starts `keygate serve` with `config` (listeners on port 0) and waits
    /// until it logs its bound ports.
    pub fn spawn(config: &std::path::Path, rust_log: &str) -> Process {
        Process::spawn_logging(config, rust_log, "json")
    }

    /// Like [`Process::spawn`], logging in `format` (`json` or `human`).
    pub fn spawn_logging(config: &std::path::Path, rust_log: &str, format: &str) -> Process {
        let log = config.with_extension("log");
        let file = std::fs::File::create(&log).unwrap();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_keygate"))
            .args(["--log-format", format, "--config"])
            .arg(config)
            .arg("serve")
            .env("KEYGATE_BOOTSTRAP_PASSWORD", "bootstrap-password")
            .env("RUST_LOG", rust_log)
            .env_remove("KEYGATE_CONFIG")
            .env_remove("NO_COLOR")
            .stderr(file)
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let line = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| l.contains("keygate is serving")) {
                break line.to_string();
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("keygate exited ({status}) before serving:\n{text}");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "keygate did not start:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        // `https=127.0.0.1:1234` in human format, a "fields" member in JSON.
        let port = |name: &str| -> u16 {
            let address = match serde_json::from_str::<serde_json::Value>(&line) {
                Ok(json) => json["fields"][name].as_str().unwrap_or("").to_string(),
                Err(_) => line
                    .split_whitespace()
                    .find_map(|field| field.strip_prefix(&format!("{name}=")))
                    .unwrap_or("")
                    .to_string(),
            };
            address.parse::<SocketAddr>().map_or(0, |a| a.port())
        };
        Process {
            https: port("https"),
            http: port("http"),
            admin: port("admin"),
            child,
            log,
        }
    }

    /// Sends a signal (`TERM`, `HUP`, ...).
    pub fn signal(&self, name: &str) {
        let status = std::process::Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

/// Overlays `extra` on `base`: its tables merge key by key, its `[[route]]`s
/// are appended.
fn merge_toml(base: &str, extra: &str) -> String {
    fn merge(into: &mut toml::Table, from: toml::Table) {
        for (key, value) in from {
            match (into.get_mut(&key), value) {
                (Some(toml::Value::Table(a)), toml::Value::Table(b)) => merge(a, b),
                (Some(toml::Value::Array(a)), toml::Value::Array(b)) if key == "route" => {
                    a.extend(b)
                }
                (_, value) => {
                    into.insert(key, value);
                }
            }
        }
    }
    let mut table: toml::Table = base.parse().unwrap();
    merge(&mut table, extra.parse().unwrap());
    toml::to_string(&table).unwrap()
}

/// keygate in front of a fresh recording upstream, with `extra` config.
pub async fn gateway(extra: &str) -> (Upstream, Gateway) {
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(&upstream.url(), extra).await;
    (upstream, gateway)
}

/// The `X-Authorization` value of an API key.
pub fn api_key_header(key: &str) -> String {
    format!("ApiKey {key}")
}

/// The value of a counter line in the metrics exposition (a series given
/// whole, or the start of one), 0 when absent.
pub fn counter(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find(|line| line.starts_with(series))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .map_or(0, |n| n as u64)
}

/// Reads a contract error body and checks its shape.
pub async fn error_body(response: reqwest::Response) -> (u16, serde_json::Value) {
    let status = response.status().as_u16();
    assert_eq!(
        response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap()),
        Some("application/json")
    );
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(json["status"], status, "{json}");
    assert!(json["timestamp"].as_u64().is_some(), "{json}");
    assert!(json["message"].is_string(), "{json}");
    (status, json)
}

/// Sends raw bytes over plain TCP and returns the raw response head and body.
pub async fn raw_http(addr: SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Sends raw bytes over TLS to the gateway's HTTPS listener (an HTTP/1.1
/// request exactly as written) and returns the raw answer: what arrived
/// before the connection closed, or within 10 s.
pub async fn raw_https(gw: &Gateway, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let port = gw.running.https.unwrap().port();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let server_name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = tls_connector(&gw.ca_pem)
        .connect(server_name, tcp)
        .await
        .unwrap();
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// A TCP relay to a real service (PostgreSQL, Redis) that a test can cut and
/// restore, standing in for that service going away without touching the one
/// every test shares.
pub struct Relay {
    pub addr: SocketAddr,
    open: Arc<std::sync::atomic::AtomicBool>,
    cuts: tokio::sync::watch::Sender<u64>,
}

impl Relay {
    pub async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (cuts, _) = tokio::sync::watch::channel(0u64);
        let accepting = open.clone();
        let watching = cuts.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                if !accepting.load(std::sync::atomic::Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let mut cut = watching.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Relay { addr, open, cuts }
    }

    /// Drops every relayed connection and refuses new ones.
    pub fn cut(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
    }

    pub fn restore(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A client for the plain-HTTP listener speaking `wire`: HTTP/1.1, or
/// HTTP/2 with prior knowledge (h2c).
pub fn plain_client_over(wire: Wire) -> reqwest::Client {
    let builder = reqwest::Client::builder().timeout(Duration::from_secs(10));
    match wire {
        Wire::Http1 => builder.http1_only(),
        Wire::Http2 => builder.http2_prior_knowledge(),
    }
    .build()
    .unwrap()
}

/// A client that trusts the CA `ca` (PEM) and nothing else.
pub fn client_trusting(ca: &[u8]) -> reqwest::Client {
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca).unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// A TLS connector, for protocols below HTTP, that trusts the CA `ca` (PEM).
pub fn tls_connector(ca: &[u8]) -> tokio_rustls::TlsConnector {
    use rustls_pki_types::pem::PemObject;
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Polls `done` every 10 ms until it holds; panics after `limit`. Returns how
/// long it took.
/// A check that cannot run here because `tool` is not installed. Where every
/// tool is required (`.ci/run` sets `KEYGATE_TEST_REQUIRE_TOOLS=1`; so does
/// any CI that sets `CI`), that fails the test; elsewhere a `SKIPPED:` line
/// goes to the terminal (past the test harness's capture), so a skip never
/// reads as a pass.
/// The PostgreSQL server of the tests that need one (each is marked
/// `#[ignore]` with that reason, so a run without it lists them as ignored,
/// never as passed; CI sets the variable and runs them with
/// `--include-ignored`).
#[allow(dead_code)]
pub fn test_database_url() -> String {
    std::env::var("KEYGATE_TEST_DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "KEYGATE_TEST_DATABASE_URL is not set: this PostgreSQL test needs it \
             (postgres://postgres@127.0.0.1:5432/test, say)"
        )
    })
}

/// A loopback port free now, for a server a test starts.
#[allow(dead_code)]
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Sends `signal` (`TERM`, `INT`, ...) to the server process `pid` a test
/// started, and waits up to `within` for it to be gone.
#[allow(dead_code)]
pub fn stop_pid(pid: u32, signal: &str, within: std::time::Duration) {
    let _ = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status();
    let deadline = std::time::Instant::now() + within;
    while std::path::Path::new(&format!("/proc/{pid}")).exists()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

pub fn skipped_without(tool: &str, check: &str) {
    use std::io::Write;
    let required = std::env::var_os("KEYGATE_TEST_REQUIRE_TOOLS").is_some()
        || std::env::var_os("CI").is_some();
    assert!(!required, "{check} needs {tool}, which is not installed");
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {check}: {tool} is not installed"
    );
}

pub async fn wait_until(
    what: &str,
    limit: Duration,
    mut done: impl AsyncFnMut() -> bool,
) -> Duration {
    let started = std::time::Instant::now();
    loop {
        if done().await {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A config with a public route to `upstream` and the certificate files
/// `data/served-{cert,key}.pem`, every listener on port 0.
pub fn write_config(
    path: &std::path::Path,
    data: &std::path::Path,
    upstream: &str,
    extra_route: &str,
) {
    let data = data.display();
    std::fs::write(
        path,
        format!(
            "[server]\ndata_dir = \"{data}\"\n[listen]\nhttps = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
             [tls]\ncert = \"{data}/served-cert.pem\"\nkey = \"{data}/served-key.pem\"\n\
             [store]\nurl = \"sqlite://{data}/k.db\"\n[[route]]\nprefix = \"/api/noauth/\"\nupstreams = [\"{upstream}\"]\npublic = true\n{extra_route}"
        ),
    )
    .unwrap();
}

/// A config serving on port 0 from `dir` (certificate and data made there),
/// its `[store]` section replaced by `store`.
#[allow(dead_code)]
pub fn config_with_store(dir: &std::path::Path, store: &str) -> std::path::PathBuf {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    certificate_into(dir, &data);
    let config = dir.join("keygate.toml");
    write_config(&config, &data, "http://127.0.0.1:9", "");
    let written = std::fs::read_to_string(&config).unwrap();
    let sqlite = format!("[store]\nurl = \"sqlite://{}/k.db\"\n", data.display());
    assert!(written.contains(&sqlite), "{written}");
    std::fs::write(&config, written.replace(&sqlite, store)).unwrap();
    config
}

/// Runs the `keygate` binary on `config` with `args`, the bootstrap password
/// set and no `KEYGATE_*` override of the runner's in the way.
#[allow(dead_code)]
pub fn run_keygate(config: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_keygate"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "warn")
        .env("KEYGATE_BOOTSTRAP_PASSWORD", "bootstrap-password")
        .env_remove("KEYGATE_CONFIG")
        .env_remove("KEYGATE_STORE_URL")
        .env_remove("KEYGATE_STORE_MIGRATE")
        .output()
        .unwrap()
}

/// Generates a development CA and certificate in `dir`; returns the CA PEM.
pub fn certificate_into(dir: &std::path::Path, data: &std::path::Path) -> Vec<u8> {
    keygate::tls::load_or_generate_dev(dir).unwrap();
    let (ca, cert, key) = keygate::tls::dev_paths(dir);
    std::fs::copy(cert, data.join("served-cert.pem")).unwrap();
    std::fs::copy(key, data.join("served-key.pem")).unwrap();
    std::fs::read(ca).unwrap()
}

/// A fresh schema on the test database; returns the URL that selects it.
pub async fn fresh_schema(base: &str) -> (String, String) {
    let schema = format!("kg_replicas_{}", uuid::Uuid::new_v4().simple());
    let mut conn = <sqlx::postgres::PgConnection as sqlx::Connection>::connect(base)
        .await
        .expect("KEYGATE_TEST_DATABASE_URL must be reachable");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&mut conn)
        .await
        .unwrap();
    let separator = if base.contains('?') { '&' } else { '?' };
    (
        format!("{base}{separator}options=-c%20search_path%3D{schema}"),
        schema,
    )
}

pub async fn drop_schema(base: &str, schema: &str) {
    if let Ok(mut conn) = <sqlx::postgres::PgConnection as sqlx::Connection>::connect(base).await {
        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
            .execute(&mut conn)
            .await;
    }
}

/// The reference entity service on a free loopback port; its URL.
pub async fn reference_upstream() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(keygate::dev::serve_reference_upstream_counted(
        listener,
        std::future::pending(),
        Default::default(),
    ));
    format!("http://{addr}")
}

/// A WebSocket over TLS to the gateway.
pub type Socket =
    tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

/// Opens a WebSocket on `path` of the gateway's HTTPS listener (the
/// upgrade goes through hyper's driver over HTTP/1.1).
pub async fn open_socket(gw: &Gateway, path: &str) -> Socket {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let port = gw.running.https.unwrap().port();
    let request = format!("wss://localhost:{port}{path}")
        .into_client_request()
        .unwrap();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let server_name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tls_connector(&gw.ca_pem)
        .connect(server_name, tcp)
        .await
        .unwrap();
    tokio_tungstenite::client_async(request, tls)
        .await
        .unwrap()
        .0
}
