//! The reference upstream "entity service": what keygate protects in the
//! examples, the tests and `keygate serve --dev`.
//!
//! It trusts the identity headers keygate sets (`X-Auth-User-Id`,
//! `X-Auth-Tenant-Id`, `X-Auth-Authority`, ...) and refuses `/api/` requests that
//! lack them (except `/api/noauth/*`). It keeps ThingsBoard-shaped devices and
//! assets in memory per tenant, and offers a few diagnostic endpoints:
//!
//! - `POST /api/device`, `GET|DELETE /api/device/{id}`, `GET /api/tenant/devices`
//! - `POST /api/asset`, `GET|DELETE /api/asset/{id}`, `GET /api/tenant/assets`
//! - `/api/echo[/*]` and `/api/noauth/echo`: describe the forwarded request
//! - `GET /api/slow?ms=N`, `GET /healthz`, `GET /v3/api-docs` (OpenAPI 3.1)
//! - `/api/ws[/*]`: a WebSocket that answers each text message with what it
//!   received and the request it was opened with (path, query, headers: the
//!   identity it was given), and echoes binary ones
//!
//! It serves HTTP/1.1 and cleartext HTTP/2 (h2c). It is for trying keygate and
//! for tests, not for production data: everything lives in memory.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use tokio::net::{TcpListener, TcpStream};
use uuid::Uuid;

const NULL_UUID: &str = "13814000-1dd2-11b2-8080-808080808080";
const MAX_JSON_BODY: usize = 1024 * 1024;
const MAX_SLEEP_MS: u64 = 60_000;
const MAX_NAME_LEN: usize = 255;

type HttpResponse = Response<Full<Bytes>>;
type ApiResult = Result<HttpResponse, Refusal>;
type Query = HashMap<String, String>;
type Entities = HashMap<Uuid, Entity>;

/// Serves the reference service on `listener` until `shutdown` completes.
pub async fn serve(listener: TcpListener, shutdown: impl std::future::Future<Output = ()>) {
    serve_counted(listener, shutdown, Arc::default()).await;
}

/// What the service counts, for tests that must show something never
/// reached it.
#[derive(Debug, Default)]
pub struct Counters {
    sockets: AtomicU64,
}

impl Counters {
    /// WebSocket upgrades accepted (answered 101) so far.
    pub fn sockets(&self) -> u64 {
        self.sockets.load(Ordering::SeqCst)
    }
}

/// [`serve`], counting into `counters`.
pub async fn serve_counted(
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
    counters: Arc<Counters>,
) {
    let store = EntityStore {
        counters,
        ..EntityStore::default()
    };
    serve_store(listener, shutdown, store).await;
}

/// [`serve`], refusing (401) every `/api/` request without a valid identity
/// assertion from keygate (`identity = "assertion"` routes), and acting as
/// the identity it asserts rather than the `X-Auth-*` headers.
pub async fn serve_verifying(
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
    check: super::verifier::AssertionCheck,
) {
    let store = EntityStore {
        verifier: Some(super::verifier::Verifier::new(check)),
        ..EntityStore::default()
    };
    serve_store(listener, shutdown, store).await;
}

async fn serve_store(
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
    store: EntityStore,
) {
    let store = Arc::new(store);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => spawn_connection(stream, Arc::clone(&store)),
                Err(err) => {
                    let _ = writeln!(std::io::stderr(), "accept failed: {err}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

fn spawn_connection(stream: TcpStream, store: Arc<EntityStore>) {
    tokio::spawn(async move {
        let service = service_fn(move |req| handle(req, Arc::clone(&store)));
        let builder = auto::Builder::new(TokioExecutor::new());
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
        if let Err(err) = connection.await {
            let _ = writeln!(std::io::stderr(), "connection error: {err}");
        }
    });
}

// ---------------------------------------------------------------------------
// Routing and identity

async fn handle(
    req: Request<Incoming>,
    store: Arc<EntityStore>,
) -> Result<HttpResponse, Infallible> {
    let result = route(req, &store).await;
    Ok(result.unwrap_or_else(Refusal::into_response))
}

async fn route(req: Request<Incoming>, store: &EntityStore) -> ApiResult {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    match (&method, path.as_str()) {
        (&Method::GET, "/healthz") => {
            return Ok(response(
                StatusCode::OK,
                "text/plain",
                Bytes::from_static(b"ok"),
            ));
        }
        (&Method::GET, "/v3/api-docs") => return Ok(json_response(StatusCode::OK, &openapi())),
        _ if is_under(&path, "/api/noauth/echo") => return echo(req).await,
        _ if !path.starts_with("/api/") || path.starts_with("/api/noauth/") => {
            return Err(Refusal::not_found());
        }
        _ => {}
    }
    let identity = match &store.verifier {
        Some(verifier) => Caller::from_assertion(&req, verifier).await?,
        None => Caller::from_request(&req)?,
    };
    if is_under(&path, "/api/echo") {
        return echo(req).await;
    }
    if is_under(&path, "/api/ws") {
        return websocket(req, &store.counters);
    }
    let query = parse_query(req.uri().query());
    if method == Method::GET && path == "/api/slow" {
        return slow(&query).await;
    }
    for kind in [Kind::Device, Kind::Asset] {
        let item_id = path.strip_prefix(&format!("/api/{}/", kind.segment()));
        let item_id = item_id.filter(|id| !id.is_empty() && !id.contains('/'));
        match (&method, item_id) {
            (&Method::POST, None) if path == format!("/api/{}", kind.segment()) => {
                return save(req.into_body(), store, &identity, kind).await;
            }
            (&Method::GET, None) if path == format!("/api/tenant/{}s", kind.segment()) => {
                return list(store, &identity, kind, &query);
            }
            (&Method::GET, Some(id)) => return get(store, &identity, kind, id),
            (&Method::DELETE, Some(id)) => return delete(store, &identity, kind, id),
            _ => {}
        }
    }
    Err(Refusal::not_found())
}

fn is_under(path: &str, prefix: &str) -> bool {
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum CallerRole {
    SysAdmin,
    TenantAdmin,
    CustomerUser,
}

struct Caller {
    tenant_id: Uuid,
    authority: CallerRole,
}

impl Caller {
    fn from_request(req: &Request<Incoming>) -> Result<Self, Refusal> {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
        };
        header("x-auth-user-id").ok_or_else(Refusal::unauthorized)?;
        let tenant_id = header("x-auth-tenant-id")
            .and_then(|v| Uuid::parse_str(v).ok())
            .ok_or_else(Refusal::unauthorized)?;
        let authority = match header("x-auth-authority") {
            Some("SYS_ADMIN") => CallerRole::SysAdmin,
            Some("TENANT_ADMIN") => CallerRole::TenantAdmin,
            Some("CUSTOMER_USER") => CallerRole::CustomerUser,
            _ => return Err(Refusal::unauthorized()),
        };
        Ok(Self {
            tenant_id,
            authority,
        })
    }

    /// The caller a valid `X-Auth-Assertion` names; 401 without one.
    async fn from_assertion(
        req: &Request<Incoming>,
        verifier: &super::verifier::Verifier,
    ) -> Result<Self, Refusal> {
        let token = req
            .headers()
            .get("x-auth-assertion")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(Refusal::unauthorized)?;
        let asserted = verifier
            .verify(token)
            .await
            .ok_or_else(Refusal::unauthorized)?;
        let authority = match asserted.authority.as_str() {
            "SYS_ADMIN" => CallerRole::SysAdmin,
            "TENANT_ADMIN" => CallerRole::TenantAdmin,
            "CUSTOMER_USER" => CallerRole::CustomerUser,
            _ => return Err(Refusal::unauthorized()),
        };
        Ok(Self {
            tenant_id: asserted.tenant_id,
            authority,
        })
    }

    /// Returns the tenant whose entities the caller may access.
    fn tenant_for(&self, write: bool) -> Result<Uuid, Refusal> {
        match self.authority {
            CallerRole::SysAdmin => Err(Refusal::forbidden()),
            CallerRole::CustomerUser if write => Err(Refusal::forbidden()),
            _ => Ok(self.tenant_id),
        }
    }
}

// ---------------------------------------------------------------------------
// Entity storage

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Device,
    Asset,
}

impl Kind {
    fn segment(self) -> &'static str {
        match self {
            Kind::Device => "device",
            Kind::Asset => "asset",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Kind::Device => "Device",
            Kind::Asset => "Asset",
        }
    }

    fn entity_type(self) -> &'static str {
        match self {
            Kind::Device => "DEVICE",
            Kind::Asset => "ASSET",
        }
    }
}

#[derive(Clone)]
struct Entity {
    id: Uuid,
    kind: Kind,
    tenant_id: Uuid,
    created_time: i64,
    name: String,
    entity_type: String,
    label: Option<String>,
}

impl Entity {
    fn to_json(&self) -> Value {
        json!({
            "id": {"entityType": self.kind.entity_type(), "id": self.id},
            "createdTime": self.created_time,
            "tenantId": {"entityType": "TENANT", "id": self.tenant_id},
            "customerId": {"entityType": "CUSTOMER", "id": NULL_UUID},
            "name": self.name,
            "type": self.entity_type,
            "label": self.label,
            "additionalInfo": null,
        })
    }
}

#[derive(Default)]
struct EntityStore {
    entities: Mutex<HashMap<(Uuid, Kind), Entities>>,
    counters: Arc<Counters>,
    /// When set, `/api/` requests need a valid `X-Auth-Assertion`, and the
    /// caller is who it asserts.
    verifier: Option<super::verifier::Verifier>,
}

impl EntityStore {
    fn with<R>(&self, tenant: Uuid, kind: Kind, f: impl FnOnce(&mut Entities) -> R) -> R {
        let mut guard = self.entities.lock().unwrap_or_else(PoisonError::into_inner);
        f(guard.entry((tenant, kind)).or_default())
    }
}

#[derive(Deserialize)]
struct SaveRequest {
    id: Option<EntityIdRef>,
    name: Option<String>,
    #[serde(rename = "type")]
    entity_type: Option<String>,
    label: Option<String>,
}

#[derive(Deserialize)]
struct EntityIdRef {
    id: Uuid,
}

// ---------------------------------------------------------------------------
// Entity handlers

async fn save(body: Incoming, store: &EntityStore, identity: &Caller, kind: Kind) -> ApiResult {
    let tenant = identity.tenant_for(true)?;
    let request: SaveRequest = read_json(body).await?;
    let title = kind.title();
    let name = request.name.as_deref().map(str::trim).unwrap_or_default();
    if name.is_empty() {
        return Err(Refusal::bad_request(format!(
            "{title} name should be specified!"
        )));
    }
    if name.chars().count() > MAX_NAME_LEN {
        let message = format!("{title} name length must be equal or less than {MAX_NAME_LEN}");
        return Err(Refusal::bad_request(message));
    }
    let entity_type = request
        .entity_type
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let entity_type = entity_type.unwrap_or("default").to_owned();
    let existing = request.id.map(|id| id.id);
    store.with(tenant, kind, |entities| {
        if existing.is_some_and(|id| !entities.contains_key(&id)) {
            return Err(Refusal::not_found());
        }
        if entities
            .values()
            .any(|e| e.name == name && Some(e.id) != existing)
        {
            let message = format!("{title} with such name already exists!");
            return Err(Refusal::bad_request(message));
        }
        let id = existing.unwrap_or_else(Uuid::new_v4);
        let entity = entities.entry(id).or_insert_with(|| Entity {
            id,
            kind,
            tenant_id: tenant,
            created_time: now_ms(),
            name: String::new(),
            entity_type: String::new(),
            label: None,
        });
        entity.name = name.to_owned();
        entity.entity_type = entity_type;
        entity.label = request.label;
        Ok(json_response(StatusCode::OK, &entity.to_json()))
    })
}

fn get(store: &EntityStore, identity: &Caller, kind: Kind, raw_id: &str) -> ApiResult {
    let tenant = identity.tenant_for(false)?;
    let id = parse_uuid(raw_id)?;
    let found = store.with(tenant, kind, |entities| {
        entities.get(&id).map(Entity::to_json)
    });
    found
        .map(|record| json_response(StatusCode::OK, &record))
        .ok_or_else(Refusal::not_found)
}

fn delete(store: &EntityStore, identity: &Caller, kind: Kind, raw_id: &str) -> ApiResult {
    let tenant = identity.tenant_for(true)?;
    let id = parse_uuid(raw_id)?;
    let removed = store.with(tenant, kind, |entities| entities.remove(&id));
    removed
        .map(|_| Response::new(Full::default()))
        .ok_or_else(Refusal::not_found)
}

fn list(store: &EntityStore, identity: &Caller, kind: Kind, query: &Query) -> ApiResult {
    let tenant = identity.tenant_for(false)?;
    let page_size = int_param(query, "pageSize", 1)?;
    let page = int_param(query, "page", 0)?;
    let text = query
        .get("textSearch")
        .map(|s| s.to_lowercase())
        .filter(|s| !s.is_empty());
    let type_filter = query.get("type").filter(|s| !s.is_empty());
    let mut items: Vec<Entity> = store.with(tenant, kind, |entities| {
        let matches = |e: &&Entity| {
            text.as_ref()
                .is_none_or(|t| e.name.to_lowercase().contains(t.as_str()))
                && type_filter.is_none_or(|t| &e.entity_type == t)
        };
        entities.values().filter(matches).cloned().collect()
    });
    items.sort_by(|a, b| (a.created_time, &a.name).cmp(&(b.created_time, &b.name)));
    let total = items.len();
    let data: Vec<Value> = items
        .iter()
        .skip(page.saturating_mul(page_size))
        .take(page_size)
        .map(Entity::to_json)
        .collect();
    let body = json!({
        "data": data,
        "totalPages": total.div_ceil(page_size),
        "totalElements": total,
        "hasNext": page.saturating_add(1).saturating_mul(page_size) < total,
    });
    Ok(json_response(StatusCode::OK, &body))
}

// ---------------------------------------------------------------------------
// Diagnostic handlers

/// Answers a WebSocket upgrade; the socket runs on its own task.
fn websocket(mut req: Request<Incoming>, counters: &Counters) -> ApiResult {
    use http::header::{CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE};
    let key = req
        .headers()
        .get(SEC_WEBSOCKET_KEY)
        .ok_or_else(|| Refusal::bad_request("Expected a WebSocket upgrade".into()))?;
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let opened = json!({
        "path": req.uri().path(),
        "query": req.uri().query(),
        "headers": headers_json(req.headers()),
    });
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        if let Ok(upgraded) = on_upgrade.await {
            let socket = tokio_tungstenite::WebSocketStream::from_raw_socket(
                TokioIo::new(upgraded),
                tokio_tungstenite::tungstenite::protocol::Role::Server,
                // keygate's own read buffer: an echo that zero-fills 128 KiB
                // per read would be the limit of every WebSocket benchmark.
                Some(crate::websocket::socket_config()),
            )
            .await;
            answer_socket(socket, opened).await;
        }
    });
    counters.sockets.fetch_add(1, Ordering::SeqCst);
    let mut response = response(StatusCode::SWITCHING_PROTOCOLS, "text/plain", Bytes::new());
    let headers = response.headers_mut();
    headers.remove(CONTENT_TYPE);
    headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(accept) = HeaderValue::from_str(&accept) {
        headers.insert(SEC_WEBSOCKET_ACCEPT, accept);
    }
    Ok(response)
}

/// Answers each text message with `opened` and what it received (JSON when
/// it parses); echoes binary messages; pings are answered by the protocol.
async fn answer_socket<S>(mut socket: tokio_tungstenite::WebSocketStream<S>, opened: Value)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures_util::{SinkExt as _, StreamExt as _};
    use tokio_tungstenite::tungstenite::Message;
    while let Some(Ok(message)) = socket.next().await {
        let reply = match message {
            Message::Text(text) => {
                let received = serde_json::from_str::<Value>(&text)
                    .unwrap_or_else(|_| Value::String(text.as_str().to_owned()));
                let mut reply = opened.clone();
                reply["received"] = received;
                Message::text(reply.to_string())
            }
            Message::Binary(bytes) => Message::Binary(bytes),
            Message::Close(_) => break,
            _ => continue,
        };
        if socket.send(reply).await.is_err() {
            break;
        }
    }
}

/// Every header, a repeated one as an array of its values.
fn headers_json(headers: &http::HeaderMap) -> Map<String, Value> {
    let mut described = Map::new();
    for name in headers.keys() {
        let values: Vec<Value> = headers
            .get_all(name)
            .iter()
            .map(|v| Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();
        let value = match <[Value; 1]>::try_from(values) {
            Ok([single]) => single,
            Err(many) => Value::Array(many),
        };
        described.insert(name.as_str().to_owned(), value);
    }
    described
}

async fn echo(req: Request<Incoming>) -> ApiResult {
    let (parts, mut body) = req.into_parts();
    let mut body_length: u64 = 0;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| Refusal::bad_request(format!("Failed to read request body: {e}")))?;
        if let Some(data) = frame.data_ref() {
            body_length += data.len() as u64;
        }
    }
    let headers = headers_json(&parts.headers);
    let body = json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "query": parts.uri.query(),
        "version": format!("{:?}", parts.version),
        "headers": headers,
        "bodyLength": body_length,
    });
    Ok(json_response(StatusCode::OK, &body))
}

async fn slow(query: &Query) -> ApiResult {
    let raw = query.get("ms").map_or("0", String::as_str);
    let requested = raw.parse::<u64>().map_err(|_| {
        Refusal::bad_request(format!(
            "Parameter 'ms' must be an integer >= 0, got '{raw}'"
        ))
    })?;
    let ms = requested.min(MAX_SLEEP_MS);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    Ok(json_response(StatusCode::OK, &json!({"sleptMs": ms})))
}

// ---------------------------------------------------------------------------
// Request helpers

async fn read_json<T: DeserializeOwned>(body: Incoming) -> Result<T, Refusal> {
    let collected = Limited::new(body, MAX_JSON_BODY)
        .collect()
        .await
        .map_err(|err| {
            if err.is::<LengthLimitError>() {
                Refusal::too_large()
            } else {
                Refusal::bad_request(format!("Failed to read request body: {err}"))
            }
        })?;
    serde_json::from_slice(&collected.to_bytes())
        .map_err(|err| Refusal::bad_request(format!("Invalid JSON request body: {err}")))
}

fn parse_uuid(raw: &str) -> Result<Uuid, Refusal> {
    Uuid::parse_str(raw).map_err(|_| Refusal::bad_request(format!("Invalid UUID string: {raw}")))
}

fn int_param(query: &Query, name: &str, min: usize) -> Result<usize, Refusal> {
    let Some(raw) = query.get(name) else {
        let message = format!("Required request parameter '{name}' is not present");
        return Err(Refusal::bad_request(message));
    };
    match raw.parse::<usize>() {
        Ok(value) if value >= min => Ok(value),
        _ => Err(Refusal::bad_request(format!(
            "Parameter '{name}' must be an integer >= {min}, got '{raw}'"
        ))),
    }
}

fn parse_query(query: Option<&str>) -> Query {
    let mut params = HashMap::new();
    let pairs = query.unwrap_or_default().split('&');
    for pair in pairs.filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        params
            .entry(form_decode(key))
            .or_insert_with(|| form_decode(value));
    }
    params
}

/// A form-encoded query component: `+` is a space, a broken escape is kept
/// as it was sent.
fn form_decode(input: &str) -> String {
    let spaced = input.replace('+', "%20");
    crate::path::percent_decode(&spaced).unwrap_or(spaced)
}

fn now_ms() -> i64 {
    let elapsed = SystemTime::now().duration_since(UNIX_EPOCH);
    let elapsed = elapsed.unwrap_or_default();
    i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
}

// ---------------------------------------------------------------------------
// Responses and errors

fn json_response(status: StatusCode, body: &Value) -> HttpResponse {
    response(status, "application/json", Bytes::from(body.to_string()))
}

fn response(status: StatusCode, content_type: &'static str, body: Bytes) -> HttpResponse {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    let content_type = HeaderValue::from_static(content_type);
    response.headers_mut().insert(CONTENT_TYPE, content_type);
    response
}

struct Refusal {
    status: StatusCode,
    code: u32,
    message: String,
}

impl Refusal {
    fn new(status: StatusCode, code: u32, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, 10, "Authentication failed")
    }

    fn forbidden() -> Self {
        let message = "You don't have permission to perform this operation!";
        Self::new(StatusCode::FORBIDDEN, 20, message)
    }

    fn bad_request(message: String) -> Self {
        Self::new(StatusCode::BAD_REQUEST, 31, message)
    }

    fn too_large() -> Self {
        let message = format!("Request body exceeds the limit of {MAX_JSON_BODY} bytes");
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, 31, message)
    }

    fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, 32, "Requested item wasn't found!")
    }

    fn into_response(self) -> HttpResponse {
        let body = json!({
            "status": self.status.as_u16(),
            "message": self.message,
            "errorCode": self.code,
            "timestamp": now_ms(),
        });
        json_response(self.status, &body)
    }
}

// ---------------------------------------------------------------------------
// OpenAPI document

fn openapi() -> Value {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for kind in [Kind::Device, Kind::Asset] {
        add_kind_paths(&mut paths, kind);
        schemas.insert(kind.title().to_owned(), entity_schema(kind));
        schemas.insert(format!("PageData{}", kind.title()), page_schema(kind));
    }
    schemas.insert(
        // Named apart from keygate's own `EntityId` and `ErrorResponse`, so
        // the joined API browser document has no clash to rename.
        "EntityRef".to_owned(),
        json!({
            "type": "object", "required": ["entityType", "id"],
            "properties": {
                "entityType": {"type": "string", "enum": ["DEVICE", "ASSET", "TENANT", "CUSTOMER"]},
                "id": {"type": "string", "format": "uuid"}
            }
        }),
    );
    schemas.insert(
        "EntityServiceError".to_owned(),
        json!({
            "type": "object", "required": ["status", "message", "errorCode", "timestamp"],
            "properties": {
                "status": {"type": "integer", "format": "int32"},
                "message": {"type": "string"},
                "errorCode": {"type": "integer", "format": "int32"},
                "timestamp": {"type": "integer", "format": "int64"}
            }
        }),
    );
    json!({
        "openapi": "3.1.0",
        "info": {"title": "Entity service", "version": env!("CARGO_PKG_VERSION"),
                 "description": "Reference upstream service; identity comes from gateway-injected X-Auth-* headers."},
        "paths": paths,
        "components": {"schemas": schemas}
    })
}

/// "an" before a vowel sound, "a" otherwise (for the kinds served here).
fn article(noun: &str) -> &'static str {
    if noun.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

fn add_kind_paths(paths: &mut Map<String, Value>, kind: Kind) {
    let (title, segment) = (kind.title(), kind.segment());
    let tags = json!([format!("{segment}-controller")]);
    let id_param = format!("{segment}Id");
    paths.insert(
        format!("/api/{segment}"),
        json!({"post": {
            "tags": tags, "operationId": format!("save{title}"),
            "summary": format!("Create or update {} {segment}", article(segment)),
            "requestBody": {"required": true, "content": json_content(title)},
            "responses": responses(json!({"description": "OK", "content": json_content(title)}))
        }}),
    );
    paths.insert(format!("/api/{segment}/{{{id_param}}}"), json!({
        "parameters": [{"name": id_param, "in": "path", "required": true, "schema": {"type": "string", "format": "uuid"}}],
        "get": {"tags": tags, "operationId": format!("get{title}ById"), "summary": format!("Get {} {segment}", article(segment)),
                "responses": responses(json!({"description": "OK", "content": json_content(title)}))},
        "delete": {"tags": tags, "operationId": format!("delete{title}"), "summary": format!("Delete {} {segment}", article(segment)),
                   "responses": responses(json!({"description": "Deleted"}))}
    }));
    let int_param = |name: &str, min: u32| json!({"name": name, "in": "query", "required": true, "schema": {"type": "integer", "minimum": min}});
    let str_param = |name: &str| json!({"name": name, "in": "query", "required": false, "schema": {"type": "string"}});
    paths.insert(format!("/api/tenant/{segment}s"), json!({"get": {
        "tags": tags, "operationId": format!("getTenant{title}s"),
        "summary": format!("Page through the tenant's {segment}s (sorted by createdTime, then name)"),
        "parameters": [int_param("pageSize", 1), int_param("page", 0), str_param("textSearch"), str_param("type")],
        "responses": responses(json!({"description": "OK", "content": json_content(&format!("PageData{title}"))}))
    }}));
}

fn json_content(schema: &str) -> Value {
    json!({"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}})
}

fn responses(ok: Value) -> Value {
    let error = |description: &str| json!({"description": description, "content": json_content("EntityServiceError")});
    json!({
        "200": ok,
        "400": error("Invalid request (errorCode 31)"),
        "401": error("Missing identity headers (errorCode 10)"),
        "403": error("Operation not permitted (errorCode 20)"),
        "404": error("Not found (errorCode 32)")
    })
}

fn entity_schema(kind: Kind) -> Value {
    let id_ref = json!({"$ref": "#/components/schemas/EntityRef"});
    json!({
        "type": "object", "required": ["name"],
        "properties": {
            "id": {"$ref": "#/components/schemas/EntityRef", "description": format!("{} id; set it to update", kind.title())},
            "createdTime": {"type": "integer", "format": "int64", "readOnly": true},
            "tenantId": id_ref, "customerId": id_ref,
            "name": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_LEN},
            "type": {"type": "string", "default": "default"},
            "label": {"type": ["string", "null"]},
            "additionalInfo": {"type": ["object", "null"]}
        }
    })
}

fn page_schema(kind: Kind) -> Value {
    json!({
        "type": "object", "required": ["data", "totalPages", "totalElements", "hasNext"],
        "properties": {
            "data": {"type": "array", "items": {"$ref": format!("#/components/schemas/{}", kind.title())}},
            "totalPages": {"type": "integer", "format": "int32"},
            "totalElements": {"type": "integer", "format": "int64"},
            "hasNext": {"type": "boolean"}
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_use_the_right_article() {
        let document = openapi();
        let summary = |path: &str, method: &str| {
            document["paths"][path][method]["summary"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(summary("/api/asset", "post"), "Create or update an asset");
        assert_eq!(summary("/api/device", "post"), "Create or update a device");
        assert_eq!(summary("/api/asset/{assetId}", "get"), "Get an asset");
        assert_eq!(
            summary("/api/device/{deviceId}", "delete"),
            "Delete a device"
        );
    }
}
