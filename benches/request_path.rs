//! What each step of the request path costs on its own: credential parsing,
//! the credential checks (cache hit and miss), the header edits on the way
//! upstream, and routing. `cargo bench --bench request_path [-- GROUP]`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use keygate::accounts::{self, NewUser};
use keygate::auth::Authenticator;
use keygate::auth::cache::Caches;
use keygate::auth::credential::{self, Credential, Secret};
use keygate::auth::jwt::TokenKeys;
use keygate::config::{CacheSettings, RouteSpec};
use keygate::identity::{AuthMethod, Authority, Identity, Passports, Principal, id_header_value};
use keygate::listener::peer::{Client, Peer};
use keygate::proxy::RouteTable;
use keygate::proxy::headers;
use keygate::store::{SessionRecord, Store};
use keygate::telemetry::Metrics;
use uuid::Uuid;

const SECRET: &[u8; 64] = b"benchmark-signing-key-benchmark-signing-key-benchmark-signing-ke";

fn credential_parsing(c: &mut Criterion) {
    let mut group = c.benchmark_group("credential");
    let key = format!("ApiKey tb_{}", "k".repeat(86));
    let token = format!("Bearer {}", "t".repeat(400));
    for (name, value) in [("api_key", key), ("bearer", token)] {
        let mut map = request_head().headers;
        map.insert(
            &credential::X_AUTHORIZATION,
            HeaderValue::from_str(&value).unwrap(),
        );
        group.bench_function(name, |b| b.iter(|| credential::parse(black_box(&map))));
    }
    group.finish();
}

/// An SQLite store (in a temporary directory: its pages stay in memory) with
/// one user, one API key and one session; the authenticator over it with
/// caches of `capacity` entries (0: every check misses and asks the store).
struct Verifier {
    auth: Authenticator,
    api_key: Credential,
    bearer: Credential,
    _dir: tempfile::TempDir,
}

async fn verifier(capacity: u64) -> Verifier {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/bench.db", dir.path().display());
    let store = Store::connect(&url, 1).await.unwrap();
    let user = accounts::create_user(
        &store,
        NewUser {
            email: "bench@example.com".into(),
            authority: Authority::TenantAdmin,
            tenant_id: Some(Uuid::new_v4()),
            customer_id: None,
            first_name: "Bench".into(),
            last_name: String::new(),
        },
        "bench-password".into(),
        &Default::default(),
    )
    .await
    .unwrap();
    let key = accounts::create_api_key(&store, &user, "tb_", "bench", 0, true)
        .await
        .unwrap();
    let tokens = Arc::new(TokenKeys::new(
        SECRET,
        "thingsboard.io",
        Duration::from_secs(9000),
        Duration::from_secs(604800),
    ));
    let session = SessionRecord::open(user.id, keygate::clock::now_ms(), String::new());
    store.insert_session(&session).await.unwrap();
    let token = tokens
        .sign_access(&user, session.id, keygate::clock::now_secs())
        .unwrap();
    let metrics = Arc::new(Metrics::new());
    let settings = CacheSettings {
        capacity,
        ttl: Duration::from_secs(3600),
        negative_ttl: Duration::from_secs(5),
    };
    let passports = Arc::new(Passports::new(settings.capacity, &metrics));
    let caches = Caches::new(&settings, &metrics, passports);
    Verifier {
        auth: Authenticator::new(store, tokens, caches, metrics),
        api_key: Credential::ApiKey(key.value),
        bearer: Credential::Bearer(Secret::new(token.token)),
        _dir: dir,
    }
}

fn credential_checks(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("verify");
    for (cache, capacity) in [("hit", 1000), ("miss", 0)] {
        let v = rt.block_on(verifier(capacity));
        for (method, credential) in [("api_key", &v.api_key), ("jwt", &v.bearer)] {
            // The first check fills the caches (when they keep anything).
            rt.block_on(v.auth.verify(credential)).unwrap();
            group.bench_function(format!("{method}_{cache}"), |b| {
                b.to_async(&rt)
                    .iter(|| v.auth.verify(black_box(credential)))
            });
        }
    }
    group.finish();
}

/// A request head as a typical API client sends it.
fn request_head() -> http::request::Parts {
    let mut builder = http::Request::builder()
        .uri("/api/tenant/devices?pageSize=10&page=0")
        .header("host", "gateway.example.com")
        .header("user-agent", "tb-rest-client/3.9 python-requests/2.32")
        .header("accept", "application/json")
        .header("accept-encoding", "gzip, deflate")
        .header("connection", "keep-alive");
    builder = builder.header("x-authorization", format!("ApiKey tb_{}", "k".repeat(86)));
    builder.body(()).unwrap().into_parts().0
}

fn identity() -> Identity {
    let principal = Arc::new(Principal::new(
        Uuid::new_v4(),
        Uuid::new_v4(),
        keygate::identity::NULL_UUID,
        Authority::TenantAdmin,
        "bench@example.com".into(),
    ));
    let key_id = Uuid::new_v4();
    Identity::new(
        principal,
        AuthMethod::ApiKey { key_id },
        id_header_value(&key_id),
    )
}

fn header_editing(c: &mut Criterion) {
    let mut group = c.benchmark_group("headers");
    let conn = Peer::accept("127.0.0.1:40000".parse().unwrap(), true, "https", &[]);
    let client = Client {
        conn: &conn,
        secure: true,
    };
    let identity = identity();
    let head = request_head();
    group.bench_function("to_upstream", |b| {
        b.iter_batched(
            || (head.clone(), headers::request_id(&HeaderMap::new(), false)),
            |(mut parts, id)| {
                headers::to_upstream(&mut parts, &client, id, Some(&identity), None);
                parts
            },
            BatchSize::SmallInput,
        )
    });
    group.bench_function("request_id", |b| {
        let none = HeaderMap::new();
        b.iter(|| headers::request_id(black_box(&none), false))
    });
    let mut response = HeaderMap::new();
    for (name, value) in [
        ("content-type", "application/json"),
        ("content-length", "42"),
        ("date", "Mon, 23 Nov 2026 08:00:00 GMT"),
        ("server", "nginx"),
        ("connection", "keep-alive"),
    ] {
        response.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    group.bench_function("to_client", |b| {
        b.iter_batched(
            || response.clone(),
            |mut map| {
                headers::to_client(&mut map, false);
                map
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn routing(c: &mut Criterion) {
    let mut group = c.benchmark_group("routing");
    let specs: Vec<RouteSpec> = (0..100)
        .map(|i| RouteSpec {
            name: format!("service{i}"),
            prefix: format!("/api/service{i}/"),
            upstreams: vec!["http://127.0.0.1:9000".parse().unwrap()],
            public: false,
            request_timeout: Duration::from_secs(60),
            openapi: None,
            quota: Default::default(),
            identity: Default::default(),
            audience: format!("service{i}"),
            upstream_tls: None,
        })
        .collect();
    let table = RouteTable::new(&specs, &Metrics::new());
    group.bench_function("100_routes_last", |b| {
        b.iter(|| table.find(black_box("/api/service99/devices/42")).is_some())
    });
    group.bench_function("100_routes_none", |b| {
        b.iter(|| table.find(black_box("/other/devices/42")).is_none())
    });
    group.bench_function("own_endpoints_proxied_path", |b| {
        b.iter(|| keygate::api::find(&Method::GET, black_box("/api/service99/devices/42")))
    });
    group.finish();
}

/// A provider on loopback that serves its discovery document and one
/// P-256 key, for as long as the bench runs; its issuer and private key.
async fn provider_double() -> (String, Vec<u8>) {
    use base64::Engine;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pair = rcgen::KeyPair::generate().unwrap();
    let raw = pair.public_key_raw().to_vec();
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let issuer = format!("http://{}", listener.local_addr().unwrap());
    let discovery = serde_json::json!({
        "issuer": issuer, "authorization_endpoint": format!("{issuer}/authorize"),
        "token_endpoint": format!("{issuer}/token"), "jwks_uri": format!("{issuer}/jwks"),
    })
    .to_string();
    let jwks = serde_json::json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "b",
        "x": b64(&raw[1..33]), "y": b64(&raw[33..])}]})
    .to_string();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut head = vec![0u8; 4096];
            let n = stream.read(&mut head).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&head[..n]);
            let body = if head.starts_with("GET /jwks") {
                &jwks
            } else {
                &discovery
            };
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(answer.as_bytes()).await;
        }
    });
    (issuer, pair.serialize_der())
}

/// The check of a provider's access token beside keygate's own, with
/// single sign-on access tokens on: the hit of each costs the same.
fn provider_token_checks(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("verify");
    let v = rt.block_on(verifier(1000));
    let (issuer, der) = rt.block_on(provider_double());
    let oidc = keygate::config::OidcSettings {
        name: "bench".into(),
        issuer: issuer.clone(),
        client_id: "keygate".into(),
        client_secret: keygate::config::ClientSecret::new("s"),
        scopes: vec!["openid".into()],
        button_label: "bench".into(),
        icon: None,
        email_claim: "email".into(),
        first_name_claim: "given_name".into(),
        last_name_claim: "family_name".into(),
        require_verified_email: true,
        creation: None,
        authority_rule: None,
        trust_provider_mfa: false,
        access_token_audience: Some("api".into()),
        ca_file: None,
    };
    let providers = keygate::sso::Providers::new(&[oidc], Some("https://g"), SECRET).unwrap();
    let auth = v.auth.with_providers(Arc::new(providers));
    let now = keygate::clock::now_secs();
    let claims = serde_json::json!({"iss": issuer, "aud": "api", "sub": "s", "iat": now,
        "exp": now + 3600, "email": "bench@example.com", "email_verified": true});
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some("b".into());
    let key = jsonwebtoken::EncodingKey::from_ec_der(&der);
    let provider = Credential::Bearer(Secret::new(
        jsonwebtoken::encode(&header, &claims, &key).unwrap(),
    ));
    for (name, credential) in [
        ("jwt_hit_with_sso", &v.bearer),
        ("provider_jwt_hit", &provider),
    ] {
        rt.block_on(auth.verify(credential)).unwrap();
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| auth.verify(black_box(credential)))
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    credential_parsing,
    credential_checks,
    provider_token_checks,
    header_editing,
    routing
);
criterion_main!(benches);
