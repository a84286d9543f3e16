//! A double of the platform's authentication, as an upstream: it accepts a
//! request only with an access token the platform itself would accept, and
//! answers with the user the platform would have built from it.
//!
//! Written from the platform's source, independently of keygate's minting
//! code (the signature is checked with HMAC directly, the claims read as
//! plain JSON). Each check names the class and method it mirrors:
//!
//! - `JwtTokenAuthenticationProcessingFilter.requiresAuthentication` and
//!   `AbstractHeaderTokenExtractor.extract`: `X-Authorization`, else
//!   `Authorization`; a value that does not start with `Bearer ` is not this
//!   filter's (here: 401 "Authentication failed").
//! - `JwtTokenFactory.parseTokenClaims` (jjwt `parseSignedClaims` with the
//!   Base64-decoded key): a signed JWS with an HMAC algorithm the key is long
//!   enough for; `exp` (and `nbf`) checked with no skew. A bad signature or an
//!   expired token is a `JwtExpiredTokenException` (401, errorCode 11), a
//!   malformed or unsigned one a `BadCredentialsException` (401, errorCode 10).
//!   The issuer is not checked there, so it is not checked here.
//! - `JwtTokenFactory.parseAccessJwtToken`: `scopes` non-empty, its first an
//!   `Authority`; `userId` a UUID; `tenantId` and `customerId` UUIDs when
//!   present (a SYS_ADMIN without `tenantId` gets the system tenant);
//!   `enabled` and `isPublic` booleans, whose absence is a null unboxed: an
//!   exception outside authentication, the platform's 500.
//! - `DefaultTokenOutdatingService.isOutdated`: `iat` against the moment the
//!   user's or the session's tokens were outdated (seconds compared).
//! - `TbWebSocketHandler`: a socket authenticates with `?token=` on the
//!   upgrade (`toRef`, a failure closes 1011) or, on `/api/ws` only, with the
//!   first frame's `authCmd` (`processMsg`: none is 1008, a bad one 1007).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use uuid::Uuid;

/// `TenantId.SYS_TENANT_ID`, the platform's "null" id.
pub const NULL_UUID: &str = "13814000-1dd2-11b2-8080-808080808080";

/// What the double saw of one request or socket: everything a client
/// credential could have reached it through.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub uri: String,
    pub headers: Vec<(String, String)>,
    /// Text frames of a socket, in order.
    pub frames: Vec<String>,
}

impl Seen {
    /// True when `secret` appears anywhere the double was sent it.
    pub fn contains(&self, secret: &str) -> bool {
        self.uri.contains(secret)
            || self.headers.iter().any(|(_, value)| value.contains(secret))
            || self.frames.iter().any(|frame| frame.contains(secret))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct State {
    seen: Vec<Seen>,
    /// `UsersSessionInvalidation`: a user's or a session's id, and the
    /// moment (ms) its earlier tokens were outdated.
    outdated: HashMap<String, i64>,
    /// The `tokenSigningKey` the platform rotated to, in place of the one
    /// it started with.
    rotated_key: Option<Vec<u8>>,
}

/// The platform double, on a free loopback port.
pub struct PlatformDouble {
    pub addr: SocketAddr,
    key: Arc<Vec<u8>>,
    state: Arc<Mutex<State>>,
}

/// Why the platform refuses a token, as it answers.
#[derive(Debug)]
pub enum Refusal {
    /// `BadCredentialsException`: 401, errorCode 10.
    BadCredentials(&'static str),
    /// `JwtExpiredTokenException`: 401, errorCode 11 (a bad signature too).
    Expired(&'static str),
    /// An exception outside authentication (a missing claim unboxed, an
    /// id that is no UUID): 500.
    ServerError(&'static str),
    /// No `Bearer` credential at all: 401 "Authentication failed".
    NotBearer,
}

impl PlatformDouble {
    /// A double whose `tokenSigningKey` is `key_base64`.
    pub async fn start(key_base64: &str) -> PlatformDouble {
        let key = Arc::new(STANDARD.decode(key_base64).expect("a Base64 key"));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state: Arc<Mutex<State>> = Arc::default();
        let (k, s) = (key.clone(), state.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, k.clone(), s.clone()));
            }
        });
        PlatformDouble { addr, key, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Everything that reached the double, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    /// Outdates every token of a user or session issued before `at_ms`, as
    /// the platform does on a password change or a logout.
    pub fn outdate(&self, id: &str, at_ms: i64) {
        self.state
            .lock()
            .unwrap()
            .outdated
            .insert(id.to_owned(), at_ms);
    }

    /// Rotates the platform's `tokenSigningKey`: from now on only tokens
    /// signed with `key_base64` verify, as after the platform's own
    /// rotation.
    pub fn rotate_key(&self, key_base64: &str) {
        self.state.lock().unwrap().rotated_key =
            Some(STANDARD.decode(key_base64).expect("a Base64 key"));
    }

    /// The user the platform builds from `token`
    /// (`JwtAuthenticationProvider.authenticate`), or why it refuses it.
    pub fn authenticate(&self, token: &str) -> Result<Value, Refusal> {
        authenticate(&self.key, &self.state, token)
    }
}

fn authenticate(key: &[u8], state: &Mutex<State>, token: &str) -> Result<Value, Refusal> {
    let rotated = state.lock().unwrap().rotated_key.clone();
    let key = rotated.as_deref().unwrap_or(key);
    // JwtAuthenticationProvider.authenticate: an empty token is refused.
    if token.is_empty() {
        return Err(Refusal::BadCredentials("Token is invalid"));
    }
    let claims = parse_token_claims(key, token)?;
    let user = parse_access_token(&claims)?;
    // DefaultTokenOutdatingService.isOutdated: iat is read unconditionally.
    let iat = claims
        .get("iat")
        .and_then(Value::as_i64)
        .ok_or(Refusal::ServerError("no iat"))?;
    let state = state.lock().unwrap();
    let outdated = |id: &str| {
        state
            .outdated
            .get(id)
            .is_some_and(|at_ms| iat < at_ms.div_euclid(1000))
    };
    let user_id = user["id"].as_str().unwrap_or_default();
    let session_id = claims.get("sessionId").and_then(Value::as_str);
    if outdated(user_id) || session_id.is_some_and(outdated) {
        return Err(Refusal::Expired("Token is outdated"));
    }
    Ok(user)
}

/// `JwtTokenFactory.parseTokenClaims`: jjwt's `parseSignedClaims` with the
/// decoded key.
fn parse_token_claims(key: &[u8], token: &str) -> Result<serde_json::Map<String, Value>, Refusal> {
    let malformed = Refusal::BadCredentials("Invalid JWT token");
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed);
    };
    let json = |text: &str| -> Option<serde_json::Map<String, Value>> {
        match serde_json::from_slice(&URL_SAFE_NO_PAD.decode(text).ok()?).ok()? {
            Value::Object(map) => Some(map),
            _ => None,
        }
    };
    let (Some(head), Some(claims)) = (json(header), json(payload)) else {
        return Err(malformed);
    };
    // No signature: an unsecured JWT, or a JWS missing its signature; jjwt
    // refuses both when a signed one is asked for.
    if signature.is_empty() {
        return Err(Refusal::BadCredentials("Unsigned JWT token"));
    }
    // jjwt refuses critical extensions it does not know.
    if head.contains_key("crit") {
        return Err(malformed);
    }
    // The algorithm is the header's, among those the key may verify: an
    // HMAC key verifies HS256/384/512 when at least as long as the digest;
    // an unsigned token ("none") is refused once a key is set.
    let algorithm = match head.get("alg").and_then(Value::as_str) {
        Some("HS256") if key.len() >= 32 => aws_lc_rs::hmac::HMAC_SHA256,
        Some("HS384") if key.len() >= 48 => aws_lc_rs::hmac::HMAC_SHA384,
        Some("HS512") if key.len() >= 64 => aws_lc_rs::hmac::HMAC_SHA512,
        _ => return Err(Refusal::BadCredentials("Unsupported JWT token")),
    };
    let Ok(signature) = URL_SAFE_NO_PAD.decode(signature) else {
        return Err(malformed);
    };
    let signed = &token[..header.len() + 1 + payload.len()];
    let key = aws_lc_rs::hmac::Key::new(algorithm, key);
    if aws_lc_rs::hmac::verify(&key, signed.as_bytes(), &signature).is_err() {
        // SignatureException is caught with ExpiredJwtException there.
        return Err(Refusal::Expired("JWT Token expired"));
    }
    let now_ms = keygate::clock::now_ms();
    let seconds = |name: &str| claims.get(name).map(|v| v.as_i64().map(|s| s * 1000));
    match seconds("exp") {
        Some(None) => return Err(malformed),
        Some(Some(exp)) if now_ms > exp => return Err(Refusal::Expired("JWT Token expired")),
        _ => {}
    }
    match seconds("nbf") {
        Some(None) => return Err(malformed),
        Some(Some(nbf)) if now_ms < nbf => return Err(malformed),
        _ => {}
    }
    Ok(claims)
}

/// `JwtTokenFactory.parseAccessJwtToken`: the `SecurityUser` the claims make.
fn parse_access_token(claims: &serde_json::Map<String, Value>) -> Result<Value, Refusal> {
    // `claims.get(name, String.class)`: absent is null; another type throws.
    let string = |name: &str| -> Result<Option<&str>, Refusal> {
        match claims.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(Refusal::ServerError("claim of the wrong type")),
        }
    };
    let uuid = |text: &str| -> Result<String, Refusal> {
        Uuid::parse_str(text)
            .map(|id| id.to_string())
            .map_err(|_| Refusal::ServerError("not a UUID"))
    };
    let scopes: Vec<&str> = match claims.get("scopes") {
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let Some(first) = scopes.first() else {
        return Err(Refusal::ServerError("JWT Token doesn't have any scopes"));
    };
    // Authority.parse: case-insensitive; an unknown one is null.
    let authority = [
        "SYS_ADMIN",
        "TENANT_ADMIN",
        "CUSTOMER_USER",
        "REFRESH_TOKEN",
        "PRE_VERIFICATION_TOKEN",
        "MFA_CONFIGURATION_TOKEN",
    ]
    .into_iter()
    .find(|known| known.eq_ignore_ascii_case(first));
    let user_id = uuid(string("userId")?.ok_or(Refusal::ServerError("no userId"))?)?;
    let tenant_id = match string("tenantId")? {
        Some(id) => Some(uuid(id)?),
        None if authority == Some("SYS_ADMIN") => Some(NULL_UUID.to_owned()),
        None => None,
    };
    let customer_id = string("customerId")?.map(uuid).transpose()?;
    let session_id = string("sessionId")?;
    // `claims.get(name, Boolean.class)` into a primitive boolean: absent is
    // a NullPointerException; another type a RequiredTypeException.
    let boolean = |name: &str| match claims.get(name) {
        Some(Value::Bool(b)) => Ok(*b),
        None | Some(Value::Null) => Err(Refusal::ServerError("boolean claim missing")),
        Some(_) => Err(Refusal::ServerError("claim of the wrong type")),
    };
    let pre_auth = matches!(
        authority,
        Some("PRE_VERIFICATION_TOKEN" | "MFA_CONFIGURATION_TOKEN")
    );
    let (first_name, last_name, enabled, is_public) = if pre_auth {
        (None, None, false, false)
    } else {
        (
            string("firstName")?,
            string("lastName")?,
            boolean("enabled")?,
            boolean("isPublic")?,
        )
    };
    Ok(json!({
        "id": user_id,
        "email": string("sub")?,
        "authority": authority,
        "tenantId": tenant_id,
        "customerId": customer_id,
        "sessionId": session_id,
        "firstName": first_name,
        "lastName": last_name,
        "enabled": enabled,
        "isPublic": is_public,
    }))
}

/// The platform's JSON error (`ThingsboardErrorResponse`).
fn error_response(refusal: &Refusal) -> (StatusCode, Value) {
    let (status, message, code) = match refusal {
        Refusal::BadCredentials(_) => (401, "Invalid username or password", 10),
        Refusal::Expired(_) => (401, "Token has expired", 11),
        Refusal::NotBearer => (401, "Authentication failed", 10),
        Refusal::ServerError(why) => (500, *why, 2),
    };
    let body = json!({
        "status": status,
        "message": message,
        "errorCode": code,
        "timestamp": keygate::clock::now_ms(),
    });
    (StatusCode::from_u16(status).unwrap(), body)
}

/// One connection: a WebSocket upgrade, else HTTP.
async fn serve(stream: TcpStream, key: Arc<Vec<u8>>, state: Arc<Mutex<State>>) {
    let mut head = [0u8; 8192];
    let text = loop {
        let Ok(n) = stream.peek(&mut head).await else {
            return;
        };
        if n == 0 {
            return;
        }
        let text = String::from_utf8_lossy(&head[..n]).into_owned();
        if text.contains("\r\n\r\n") || n == head.len() {
            break text;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    };
    if text.to_ascii_lowercase().contains("upgrade: websocket") {
        socket(stream, &text, key, state).await;
        return;
    }
    let service = service_fn(move |req: Request<Incoming>| {
        let (key, state) = (key.clone(), state.clone());
        async move { Ok::<_, std::convert::Infallible>(answer(req, &key, &state)) }
    });
    let _ = auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

fn record(state: &Mutex<State>, uri: String, headers: &HeaderMap) -> usize {
    let headers = headers
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let mut state = state.lock().unwrap();
    state.seen.push(Seen {
        uri,
        headers,
        frames: Vec::new(),
    });
    state.seen.len() - 1
}

/// An HTTP request, through the platform's JWT filter.
fn answer(req: Request<Incoming>, key: &[u8], state: &Mutex<State>) -> Response<Full<Bytes>> {
    record(state, req.uri().to_string(), req.headers());
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.trim().is_empty())
    };
    let outcome = match header("x-authorization").or_else(|| header("authorization")) {
        Some(value) if value.starts_with("Bearer ") => {
            authenticate(key, state, &value["Bearer ".len()..])
        }
        _ => Err(Refusal::NotBearer),
    };
    let (status, body) = match outcome {
        Ok(user) => (StatusCode::OK, user),
        Err(refusal) => error_response(&refusal),
    };
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// A socket, through `TbWebSocketHandler`. Once authenticated it sends the
/// user as `{"securityUser": ...}`, then answers each text frame with
/// `{"echo": <frame>}`.
async fn socket(stream: TcpStream, head: &str, key: Arc<Vec<u8>>, state: Arc<Mutex<State>>) {
    // The upgrade's target and headers, read from its head (peeked, so the
    // handshake below reads it again).
    let mut lines = head.split("\r\n");
    let uri = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .unwrap_or_default()
        .to_owned();
    let mut headers = HeaderMap::new();
    for line in lines.take_while(|line| !line.is_empty()) {
        if let Some((name, value)) = line.split_once(':')
            && let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(name.trim().as_bytes()),
                http::HeaderValue::from_str(value.trim()),
            )
        {
            headers.append(name, value);
        }
    }
    let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
        return;
    };
    let index = record(&state, uri.clone(), &headers);
    let close = |code: u16, reason: &str| {
        Message::Close(Some(CloseFrame {
            code: CloseCode::from(code),
            reason: reason.to_owned().into(),
        }))
    };
    let path = uri.split('?').next().unwrap_or_default().to_owned();
    let general = path == "/api/ws";
    if !general && !path.starts_with("/api/ws/plugins/") {
        let _ = ws.send(close(1007, "Unknown session type")).await;
        return;
    }
    // toRef: `token=` read by a plain prefix match over `&`-split pairs.
    let query_token = uri
        .split_once('?')
        .and_then(|(_, q)| q.split('&').find_map(|p| p.strip_prefix("token=")))
        .filter(|t| !t.is_empty())
        .map(str::to_owned);
    let mut user = match query_token {
        Some(token) => match authenticate(&key, &state, &token) {
            Ok(user) => Some(user),
            Err(_) => {
                let _ = ws.send(close(1011, "Token is invalid")).await;
                return;
            }
        },
        None => None,
    };
    if let Some(user) = &user {
        let hello = json!({ "securityUser": user }).to_string();
        let _ = ws.send(Message::text(hello)).await;
    }
    while let Some(Ok(message)) = ws.next().await {
        let text = match message {
            Message::Text(text) => text.as_str().to_owned(),
            Message::Close(_) => break,
            _ => continue,
        };
        state.lock().unwrap().seen[index].frames.push(text.clone());
        if user.is_none() {
            // processMsg: the legacy endpoints' wrappers carry no authCmd.
            let frame: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            let auth_cmd = frame.get("authCmd").filter(|_| general);
            let Some(auth_cmd) = auth_cmd else {
                let _ = ws.send(close(1008, "Auth cmd is missing")).await;
                return;
            };
            // An apiKey is the platform's own key store's: keygate's keys
            // are not there.
            let token = auth_cmd.get("token").and_then(Value::as_str).unwrap_or("");
            match authenticate(&key, &state, token) {
                Ok(found) if auth_cmd.get("apiKey").is_none() => {
                    let hello = json!({ "securityUser": found }).to_string();
                    user = Some(found);
                    let _ = ws.send(Message::text(hello)).await;
                }
                _ => {
                    let _ = ws.send(close(1007, "Invalid credentials")).await;
                    return;
                }
            }
            continue;
        }
        let echo = json!({ "echo": text }).to_string();
        if ws.send(Message::text(echo)).await.is_err() {
            break;
        }
    }
}
