//! End to end: the API browser against a hostile upstream that publishes an
//! OpenAPI document naming another origin as its server, and the headers that
//! keep the page to keygate's origin.

mod common;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{DocumentUpstream, Gateway, Process, Upstream};
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{Value, json};
use tokio::net::TcpListener;

const ATTACKER: &str = "https://attacker.example:8443";

/// The document a hostile upstream publishes: the attacker as its server at
/// the document, path and operation level, in a callback and in a link, and
/// behind external references.
fn hostile_document() -> Value {
    json!({
        "openapi": "3.1.0",
        "info": {"title": "hostile", "version": "1"},
        "servers": [{"url": ATTACKER}],
        "paths": {
            "/hostile/loot": {
                "servers": [{"url": format!("{ATTACKER}/path-level")}],
                "get": {
                    "operationId": "stealKey",
                    "servers": [{"url": format!("{ATTACKER}/operation-level")}],
                    "callbacks": {"onLoot": {"{$request.query.cb}": {
                        "servers": [{"url": format!("{ATTACKER}/callback")}],
                        "post": {"servers": [{"url": format!("{ATTACKER}/callback-op")}], "responses": {"200": {"description": "ok"}}}
                    }}},
                    "responses": {"200": {
                        "description": "ok",
                        "links": {"again": {"operationId": "stealKey", "server": {"url": format!("{ATTACKER}/link")}}},
                        "content": {"application/json": {"schema": {"$ref": format!("{ATTACKER}/schemas.json#/Loot")}}}
                    }}
                }
            },
            "/hostile/more": {"$ref": format!("{ATTACKER}/paths.json#/more")}
        },
        "components": {"schemas": {"Loot": {"$ref": format!("{ATTACKER}/loot.json")}}}
    })
}

/// An upstream that answers its OpenAPI document at `/v3/api-docs`.
async fn hostile_upstream(document: Value) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = Bytes::from(document.to_string());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let service = service_fn(move |_req: Request<Incoming>| {
                    let body = body.clone();
                    async move {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(body))
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
    format!("http://{addr}")
}

/// Every string (key or value) in `value` that names `origin`.
fn mentions(value: &Value, origin: &str) -> Vec<String> {
    match value {
        Value::String(s) if s.contains(origin) => vec![s.clone()],
        Value::Object(map) => map
            .iter()
            .flat_map(|(k, v)| {
                let mut found = mentions(v, origin);
                if k.contains(origin) {
                    found.push(k.clone());
                }
                found
            })
            .collect(),
        Value::Array(items) => items.iter().flat_map(|v| mentions(v, origin)).collect(),
        _ => Vec::new(),
    }
}

/// Every `servers` array and `server` object keygate's document holds, by
/// JSON pointer, outside the schemas (where those names are data).
fn server_entries(value: &Value, at: &str, found: &mut Vec<String>) {
    if at.starts_with("/components/schemas") {
        return;
    }
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let here = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
                if (key == "servers" && child.is_array()) || (key == "server" && child.is_object())
                {
                    found.push(here.clone());
                }
                server_entries(child, &here, found);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                server_entries(item, &format!("{at}/{i}"), found);
            }
        }
        _ => {}
    }
}

#[tokio::test]
async fn hostile_upstream_servers_never_reach_the_joined_document() {
    let upstream = Upstream::start().await;
    let hostile = hostile_upstream(hostile_document()).await;
    let extra = format!(
        "[[route]]\nname = \"hostile\"\nprefix = \"/hostile/\"\nupstreams = [\"{hostile}\"]\nopenapi = \"/v3/api-docs\"\n"
    );
    let gw = Gateway::start(&upstream.url(), &extra).await;
    let client = gw.client();
    let deadline = Instant::now() + Duration::from_secs(10);
    let doc = loop {
        let doc: Value = client
            .get(gw.https("/v3/api-docs"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if doc["paths"].get("/hostile/loot").is_some() {
            break doc;
        }
        assert!(
            Instant::now() < deadline,
            "the hostile document was not joined"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(mentions(&doc, "attacker.example"), Vec::<String>::new());
    let mut servers = Vec::new();
    server_entries(&doc, "", &mut servers);
    assert_eq!(servers, Vec::<String>::new(), "no server anywhere");
    assert_eq!(
        doc["paths"]["/hostile/loot"]["get"]["operationId"], "stealKey",
        "the operation itself is kept, to be called through keygate"
    );
    assert!(doc["paths"]["/hostile/loot"]["get"]["security"].is_array());
}

#[tokio::test]
async fn api_browser_page_assets_and_document_refuse_framing_sniffing_and_foreign_origins() {
    let (_upstream, gw) = common::gateway("").await;
    let client = gw.client();
    let page = client
        .get(gw.https("/swagger-ui.html"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap().to_ascii_lowercase();
    assert_eq!(
        html.matches("<script").count(),
        html.matches("<script src=\"/swagger-ui/").count(),
        "every script is a file keygate serves: {html}"
    );
    assert!(!html.contains("<style") && !html.contains("style="));
    for path in [
        "/swagger-ui.html",
        "/swagger-ui/keygate-api-browser.js",
        "/swagger-ui/keygate-api-browser.css",
        "/swagger-ui/swagger-ui-bundle.js",
        "/swagger-ui/swagger-ui.css",
        "/swagger-ui/favicon-32x32.png",
        "/v3/api-docs",
    ] {
        for method in [http::Method::GET, http::Method::HEAD] {
            let response = client
                .request(method.clone(), gw.https(path))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{method} {path}");
            let headers = response.headers();
            let csp = headers["content-security-policy"].to_str().unwrap();
            let directives: Vec<&str> = csp.split(';').map(str::trim).collect();
            for wanted in [
                "default-src 'self'",
                "script-src 'self'",
                "connect-src 'self'",
                "frame-ancestors 'none'",
                "object-src 'none'",
                "base-uri 'none'",
                "form-action 'self'",
            ] {
                assert!(directives.contains(&wanted), "{path}: {wanted} in {csp}");
            }
            assert!(!csp.contains("unsafe-"), "{path}: {csp}");
            assert_eq!(headers["x-frame-options"], "DENY", "{path}");
            assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
            assert_eq!(headers["referrer-policy"], "no-referrer", "{path}");
        }
    }
    // Swagger UI's own pages, which lack keygate's credential rule, are not served.
    let response = client
        .get(gw.https("/swagger-ui/swagger-initializer.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
}

/// Where Swagger UI usually lives, its stock page (whose login sends
/// `Authorization: Basic`) is never served: keygate's page answers instead.
#[tokio::test]
async fn stock_swagger_ui_addresses_lead_to_keygates_page() {
    let (_upstream, gw) = common::gateway("").await;
    let not_following = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&gw.ca_pem).unwrap())
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for path in ["/swagger-ui", "/swagger-ui/", "/swagger-ui/index.html"] {
        let response = not_following.get(gw.https(path)).send().await.unwrap();
        assert_eq!(response.status(), 302, "{path}");
        assert_eq!(response.headers()["location"], "/swagger-ui.html", "{path}");
        assert!(
            response.headers().contains_key("content-security-policy"),
            "{path}"
        );
        let page = gw.client().get(gw.https(path)).send().await.unwrap();
        assert_eq!(page.url().path(), "/swagger-ui.html", "{path}");
        let html = page.text().await.unwrap();
        assert!(
            html.contains("/swagger-ui/keygate-api-browser.js"),
            "{path}: {html}"
        );
        assert!(!html.contains("swagger-initializer"), "{path}: {html}");
    }
}

/// Joining a document whose schemas clash with keygate's own logs each clash
/// once, not on every refresh; a changed document logs its clashes again.
#[tokio::test]
async fn a_schema_clash_is_logged_once_per_document_version_not_every_refresh() {
    let document = |version: &str| {
        json!({
            "openapi": "3.1.0",
            "info": {"title": "entities", "version": version},
            "paths": {"/api/device": {"get": {"responses": {"200": {"description": "ok"}}}}},
            "components": {"schemas": {
                "User": {"type": "object", "properties": {"login": {"type": "string"}}},
                "ErrorResponse": {"type": "object", "properties": {"error": {"type": "string"}}}
            }}
        })
    };
    let documented = DocumentUpstream::start(document("1")).await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().display();
    let config = dir.path().join("keygate.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndata_dir = \"{data}\"\n[listen]\nhttps = \"\"\nhttp = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
             [store]\nurl = \"sqlite://{data}/k.db\"\n[api_browser]\nrefresh = \"50ms\"\n\
             [[route]]\nname = \"entities\"\nprefix = \"/api/\"\nupstreams = [\"{}\"]\nopenapi = \"/v3/api-docs\"\n",
            documented.url()
        ),
    )
    .unwrap();
    let mut process = Process::spawn(&config, "info");
    let clashes = || {
        std::fs::read_to_string(&process.log)
            .unwrap()
            .lines()
            .filter(|line| line.contains("OpenAPI schema name clash"))
            .count()
    };
    // A document fetched N times has been joined at least N - 1 times.
    documented.wait_for_fetches(6).await;
    assert_eq!(clashes(), 2, "User and ErrorResponse, once each");

    documented.publish(document("2"));
    let seen = documented.fetches();
    documented.wait_for_fetches(seen + 6).await;
    assert_eq!(clashes(), 4, "the new version's clashes, once each");
    let doc: Value = reqwest::get(format!("http://127.0.0.1:{}/v3/api-docs", process.http))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["components"]["schemas"]["User_entities"].is_object());
    process.signal("TERM");
    let _ = process.child.wait();
}

/// An upstream whose document is not ready when keygate starts (it starts
/// later in the same pod, say) is joined within seconds, not after a whole
/// refresh interval.
#[tokio::test]
async fn an_upstream_document_that_fails_at_first_is_fetched_again_soon() {
    let documented = DocumentUpstream::start(json!("not ready yet")).await;
    let upstream_url = documented.url();
    let gw = Gateway::start(
        &upstream_url,
        &format!(
            "[api_browser]\nrefresh = \"1h\"\n[[route]]\nname = \"late\"\nprefix = \"/late/\"\nupstreams = [\"{upstream_url}\"]\nopenapi = \"/v3/api-docs\"\n"
        ),
    )
    .await;
    documented.wait_for_fetches(1).await;
    documented.publish(json!({
        "openapi": "3.1.0",
        "info": {"title": "late", "version": "1"},
        "paths": {"/late/thing": {"get": {"responses": {"200": {"description": "ok"}}}}}
    }));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let doc: serde_json::Value = gw
            .client()
            .get(gw.https("/v3/api-docs"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if doc["paths"].get("/late/thing").is_some() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the late document was not joined"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn served_login_script_asks_for_the_second_factor_inside_the_dialog() {
    let (_upstream, gw) = common::gateway("").await;
    let script = gw
        .client()
        .get(gw.https("/swagger-ui/keygate-api-browser.js"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // The login's pre-verification answer leads to a code field in the
    // dialog, checked at the platform's endpoint with that token.
    for wiring in [
        "answer.scope === \"PRE_VERIFICATION_TOKEN\"",
        "\"/api/auth/2fa/providers\"",
        "\"/api/auth/2fa/verification/check?providerType=\"",
        "\"keygate-login-code\"",
        "answer.scope === \"MFA_CONFIGURATION_TOKEN\"",
    ] {
        assert!(script.contains(wiring), "missing {wiring}");
    }
}
