//! A small OpenID Connect provider double on loopback (plain HTTP, which
//! keygate allows for a loopback issuer): discovery, a JWKS of one EC P-256
//! key, and a token endpoint that checks the client's Basic credentials and
//! the PKCE verifier of the code it was told to expect.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use tokio::net::TcpListener;

pub const CLIENT_ID: &str = "keygate";
pub const CLIENT_SECRET: &str = "double-secret";

/// A code the double will exchange: the PKCE challenge it must match and
/// the claims of the ID token it answers (nonce, iss, aud, times added).
struct Grant {
    challenge: String,
    nonce: String,
    claims: Value,
}

#[derive(Default)]
struct State {
    codes: HashMap<String, Grant>,
    token_requests: usize,
    jwks_fetches: usize,
}

pub struct Provider {
    pub addr: SocketAddr,
    private_der: Vec<u8>,
    state: Arc<Mutex<State>>,
}

impl Provider {
    pub async fn start() -> Provider {
        let pair = rcgen::KeyPair::generate().unwrap();
        let raw = pair.public_key_raw().to_vec();
        let jwks = json!({"keys": [{
            "kty": "EC", "crv": "P-256", "kid": "double-1", "use": "sig", "alg": "ES256",
            "x": URL_SAFE_NO_PAD.encode(&raw[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&raw[33..]),
        }]});
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state: Arc<Mutex<State>> = Arc::default();
        let provider = Provider {
            addr,
            private_der: pair.serialize_der(),
            state: state.clone(),
        };
        let issuer = provider.issuer();
        let signer = provider.signer();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (state, jwks, issuer, signer) =
                    (state.clone(), jwks.clone(), issuer.clone(), signer.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let (state, jwks, issuer, signer) =
                            (state.clone(), jwks.clone(), issuer.clone(), signer.clone());
                        async move {
                            Ok::<_, std::convert::Infallible>(
                                answer(req, &state, &jwks, &issuer, &signer).await,
                            )
                        }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        provider
    }

    pub fn issuer(&self) -> String {
        format!("http://127.0.0.1:{}", self.addr.port())
    }

    fn signer(&self) -> Signer {
        Signer {
            der: Arc::new(self.private_der.clone()),
        }
    }

    /// The `[[oidc]]` of this double, named `name`, with `extra` lines.
    pub fn config(&self, name: &str, extra: &str) -> String {
        format!(
            r#"
[[oidc]]
name = "{name}"
issuer = "{issuer}"
client_id = "{CLIENT_ID}"
client_secret = "{CLIENT_SECRET}"
{extra}
"#,
            issuer = self.issuer()
        )
    }

    /// Expects `code` for the sign-in whose authorization URL was
    /// `authorization`: its challenge and nonce; the ID token will hold
    /// `claims` besides.
    pub fn expect_code(&self, code: &str, authorization: &str, claims: Value) {
        let query = authorization.split_once('?').unwrap().1;
        let param = |name: &str| {
            query
                .split('&')
                .find_map(|pair| pair.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("no {name} in {authorization}"))
                .to_owned()
        };
        assert_eq!(param("code_challenge_method"), "S256");
        self.state.lock().unwrap().codes.insert(
            code.into(),
            Grant {
                challenge: param("code_challenge"),
                nonce: param("nonce"),
                claims,
            },
        );
    }

    /// An access token of this provider for `audience` with `claims`.
    pub fn access_token(&self, audience: &str, claims: Value) -> String {
        let now = keygate::clock::now_secs();
        let mut all = json!({"iss": self.issuer(), "aud": audience, "sub": "double-user",
            "iat": now, "exp": now + 300});
        merge(&mut all, claims);
        self.signer().sign(&all, Some("at+jwt"))
    }

    pub fn token_requests(&self) -> usize {
        self.state.lock().unwrap().token_requests
    }

    pub fn jwks_fetches(&self) -> usize {
        self.state.lock().unwrap().jwks_fetches
    }
}

#[derive(Clone)]
struct Signer {
    der: Arc<Vec<u8>>,
}

impl Signer {
    fn sign(&self, claims: &Value, typ: Option<&str>) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some("double-1".into());
        header.typ = typ.map(str::to_owned);
        let key = EncodingKey::from_ec_der(&self.der);
        jsonwebtoken::encode(&header, claims, &key).unwrap()
    }
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(into), Value::Object(from)) = (into.as_object_mut(), from) {
        into.extend(from);
    }
}

fn json_answer(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

async fn answer(
    req: Request<Incoming>,
    state: &Mutex<State>,
    jwks: &Value,
    issuer: &str,
    signer: &Signer,
) -> Response<Full<Bytes>> {
    match req.uri().path() {
        "/.well-known/openid-configuration" => json_answer(
            StatusCode::OK,
            json!({
                "issuer": issuer,
                "authorization_endpoint": format!("{issuer}/authorize"),
                "token_endpoint": format!("{issuer}/token"),
                "jwks_uri": format!("{issuer}/jwks"),
                "token_endpoint_auth_methods_supported": ["client_secret_basic"],
                "code_challenge_methods_supported": ["S256"],
            }),
        ),
        "/jwks" => {
            state.lock().unwrap().jwks_fetches += 1;
            json_answer(StatusCode::OK, jwks.clone())
        }
        "/token" => token(req, state, issuer, signer).await,
        _ => json_answer(StatusCode::NOT_FOUND, json!({"error": "not_found"})),
    }
}

async fn token(
    req: Request<Incoming>,
    state: &Mutex<State>,
    issuer: &str,
    signer: &Signer,
) -> Response<Full<Bytes>> {
    let basic =
        base64::engine::general_purpose::STANDARD.encode(format!("{CLIENT_ID}:{CLIENT_SECRET}"));
    let authorized = req
        .headers()
        .get("authorization")
        .is_some_and(|v| v.to_str().ok() == Some(format!("Basic {basic}").as_str()));
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let form: HashMap<String, String> = String::from_utf8_lossy(&body)
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), keygate_decode(v)))
        .collect();
    let mut state = state.lock().unwrap();
    state.token_requests += 1;
    if !authorized {
        return json_answer(StatusCode::UNAUTHORIZED, json!({"error": "invalid_client"}));
    }
    let Some(grant) = form.get("code").and_then(|code| state.codes.remove(code)) else {
        return json_answer(StatusCode::BAD_REQUEST, json!({"error": "invalid_grant"}));
    };
    let verifier = form.get("code_verifier").cloned().unwrap_or_default();
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, verifier.as_bytes());
    if URL_SAFE_NO_PAD.encode(digest.as_ref()) != grant.challenge {
        return json_answer(StatusCode::BAD_REQUEST, json!({"error": "invalid_grant"}));
    }
    let now = keygate::clock::now_secs();
    let mut claims = json!({"iss": issuer, "aud": CLIENT_ID, "sub": "double-user",
        "nonce": grant.nonce, "iat": now, "exp": now + 300});
    merge(&mut claims, grant.claims);
    json_answer(
        StatusCode::OK,
        json!({"id_token": signer.sign(&claims, None), "access_token": "opaque", "token_type": "Bearer"}),
    )
}

/// A form value with its `%XX` escapes decoded.
fn keygate_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("00");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
