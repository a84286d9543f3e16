//! The API browser: Swagger UI at `/swagger-ui.html` (assets built into the
//! binary) and the OpenAPI document at `/v3/api-docs`, which joins keygate's
//! own endpoints with the documents its upstreams publish.
//!
//! Upstream documents are fetched at start and every `api_browser.refresh`; the
//! last good copy is kept when an upstream is down or answers garbage, so one
//! broken upstream never breaks the page. Their paths are kept only where they
//! route to that upstream through keygate, and get keygate's security
//! requirement (none on public routes). Clashes resolve predictably: keygate's
//! own paths and schemas win, then upstreams in route order; a clashing schema
//! of a later upstream is renamed `<Name>_<route>` and its references follow.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, Uri, header};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Map, Value};
use tokio::sync::watch;

use crate::api::openapi;
use crate::body::{self, Body};
use crate::config::RouteSpec;

const PAGE: &str = include_str!("../assets/swagger-ui.html");

/// An upstream document source: the route it belongs to and where to fetch it.
#[derive(Debug, Clone)]
pub struct Source {
    pub route: String,
    pub prefix: String,
    pub public: bool,
    pub url: Uri,
}

pub struct Browser {
    own: Value,
    sources: Vec<Source>,
    /// Last good document per source, by index in `sources`.
    fetched: RwLock<BTreeMap<usize, Value>>,
    /// The merged document, serialised once per change.
    merged: RwLock<Bytes>,
    assets: Arc<utoipa_swagger_ui::Config<'static>>,
}

impl Browser {
    pub fn new(routes: &[RouteSpec]) -> Browser {
        let sources = routes
            .iter()
            .filter_map(|route| {
                let url = route.openapi.clone()?;
                Some(Source {
                    route: route.name.clone(),
                    prefix: route.prefix.clone(),
                    public: route.public,
                    url,
                })
            })
            .collect();
        let own = openapi::document();
        let merged = RwLock::new(Bytes::from(own.to_string()));
        Browser {
            own,
            sources,
            fetched: RwLock::new(BTreeMap::new()),
            merged,
            assets: Arc::new(utoipa_swagger_ui::Config::new(["/v3/api-docs"])),
        }
    }

    /// Does keygate answer this path as part of the browser?
    pub fn owns(path: &str) -> bool {
        path == "/swagger-ui.html" || path == "/v3/api-docs" || path.starts_with("/swagger-ui/")
    }

    pub fn handle(&self, path: &str) -> Response<Body> {
        match path {
            "/swagger-ui.html" => respond(
                "text/html; charset=utf-8",
                Bytes::from_static(PAGE.as_bytes()),
            ),
            "/v3/api-docs" => {
                let doc = self.merged.read().map(|d| d.clone()).unwrap_or_default();
                respond("application/json", doc)
            }
            _ => {
                let file = path.trim_start_matches("/swagger-ui/");
                match utoipa_swagger_ui::serve(file, self.assets.clone()) {
                    Ok(Some(found)) => {
                        respond(content_type(file), Bytes::from(found.bytes.into_owned()))
                    }
                    _ => crate::error::ApiError::not_found().into_response(),
                }
            }
        }
    }

    /// Fetches every upstream document now, then every `refresh`, until shutdown.
    pub async fn refresh_loop(
        self: Arc<Self>,
        refresh: Duration,
        timeout: Duration,
        mut shutdown: watch::Receiver<bool>,
    ) {
        if self.sources.is_empty() {
            return;
        }
        let client: Client<HttpConnector, http_body_util::Empty<Bytes>> =
            Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        loop {
            for (index, source) in self.sources.iter().enumerate() {
                match fetch(&client, &source.url, timeout).await {
                    Ok(doc) => {
                        if let Ok(mut fetched) = self.fetched.write() {
                            fetched.insert(index, doc);
                        }
                    }
                    Err(error) => tracing::warn!(
                        route = %source.route,
                        url = %source.url,
                        %error,
                        "upstream OpenAPI document unavailable; keeping the last good copy"
                    ),
                }
            }
            self.rebuild();
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(refresh) => {}
            }
        }
    }

    fn rebuild(&self) {
        let documents: Vec<(Source, Value)> = match self.fetched.read() {
            Ok(fetched) => fetched
                .iter()
                .map(|(i, doc)| (self.sources[*i].clone(), doc.clone()))
                .collect(),
            Err(_) => return,
        };
        let merged = merge(&self.own, &documents);
        if let Ok(mut slot) = self.merged.write() {
            *slot = Bytes::from(merged.to_string());
        }
    }
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

async fn fetch(
    client: &Client<HttpConnector, http_body_util::Empty<Bytes>>,
    url: &Uri,
    timeout: Duration,
) -> Result<Value, String> {
    let request = http::Request::get(url.clone())
        .header(header::ACCEPT, "application/json")
        .body(http_body_util::Empty::new())
        .map_err(|e| e.to_string())?;
    let work = async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("status {}", response.status()));
        }
        let bytes = http_body_util::Limited::new(response.into_body(), 8 * 1024 * 1024)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
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

/// Joins keygate's document with upstream documents (see the module docs).
pub fn merge(own: &Value, upstreams: &[(Source, Value)]) -> Value {
    let mut merged = own.clone();
    for (source, doc) in upstreams {
        let mut doc = doc.clone();
        let renames = merge_schemas(&mut merged, &doc, source);
        if !renames.is_empty() {
            rewrite_refs(&mut doc, &renames);
        }
        merge_paths(&mut merged, &doc, source);
        merge_tags(&mut merged, &doc);
    }
    merged
}

fn object_at<'a>(value: &'a mut Value, keys: &[&str]) -> &'a mut Map<String, Value> {
    let mut current = value;
    for key in keys {
        if !current.is_object() {
            *current = Value::Object(Map::new());
        }
        current = current
            .as_object_mut()
            .map(|m| {
                m.entry(key.to_string())
                    .or_insert_with(|| Value::Object(Map::new()))
            })
            .expect("just made an object");
    }
    if !current.is_object() {
        *current = Value::Object(Map::new());
    }
    current.as_object_mut().expect("just made an object")
}

fn merge_schemas(merged: &mut Value, doc: &Value, source: &Source) -> BTreeMap<String, String> {
    let mut renames = BTreeMap::new();
    let Some(schemas) = doc
        .pointer("/components/schemas")
        .and_then(Value::as_object)
    else {
        return renames;
    };
    let target = object_at(merged, &["components", "schemas"]);
    for (name, schema) in schemas {
        match target.get(name) {
            None => {
                target.insert(name.clone(), schema.clone());
            }
            Some(existing) if existing == schema => {}
            Some(_) => {
                let suffix: String = source
                    .route
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                    .collect();
                let renamed = format!("{name}_{suffix}");
                tracing::warn!(schema = %name, route = %source.route, renamed = %renamed, "OpenAPI schema name clash; renamed the upstream's schema");
                renames.insert(name.clone(), renamed.clone());
            }
        }
    }
    for (name, renamed) in &renames {
        if let Some(schema) = schemas.get(name) {
            target.insert(renamed.clone(), schema.clone());
        }
    }
    renames
}

fn rewrite_refs(value: &mut Value, renames: &BTreeMap<String, String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if key == "$ref" {
                    if let Some(target) = child
                        .as_str()
                        .and_then(|r| r.strip_prefix("#/components/schemas/"))
                    {
                        if let Some(renamed) = renames.get(target) {
                            *child = Value::String(format!("#/components/schemas/{renamed}"));
                        }
                    }
                } else {
                    rewrite_refs(child, renames);
                }
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|item| rewrite_refs(item, renames)),
        _ => {}
    }
}

fn merge_paths(merged: &mut Value, doc: &Value, source: &Source) {
    let Some(paths) = doc.get("paths").and_then(Value::as_object) else {
        return;
    };
    let security = if source.public {
        Value::Array(Vec::new())
    } else {
        openapi::secured()
    };
    let target = object_at(merged, &["paths"]);
    for (path, item) in paths {
        if !path.starts_with(&source.prefix) {
            continue; // not reachable through this route
        }
        if target.contains_key(path) {
            tracing::warn!(path = %path, route = %source.route, "OpenAPI path already documented; keeping the first");
            continue;
        }
        let mut item = item.clone();
        if let Some(operations) = item.as_object_mut() {
            for (method, operation) in operations.iter_mut() {
                let is_operation = matches!(
                    method.as_str(),
                    "get" | "put" | "post" | "delete" | "patch" | "head" | "options" | "trace"
                );
                if let (true, Some(op)) = (is_operation, operation.as_object_mut()) {
                    op.insert("security".into(), security.clone());
                }
            }
        }
        target.insert(path.clone(), item);
    }
}

fn merge_tags(merged: &mut Value, doc: &Value) {
    let Some(tags) = doc.get("tags").and_then(Value::as_array) else {
        return;
    };
    if !merged.get("tags").is_some_and(Value::is_array) {
        if let Some(map) = merged.as_object_mut() {
            map.insert("tags".into(), Value::Array(Vec::new()));
        }
    }
    if let Some(existing) = merged.get_mut("tags").and_then(Value::as_array_mut) {
        for tag in tags {
            let name = tag.get("name");
            if !existing.iter().any(|t| t.get("name") == name) {
                existing.push(tag.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn source(route: &str, prefix: &str, public: bool) -> Source {
        Source {
            route: route.into(),
            prefix: prefix.into(),
            public,
            url: "http://127.0.0.1:1/v3/api-docs".parse().unwrap(),
        }
    }

    #[test]
    fn upstream_paths_join_with_keygate_security_and_own_paths_win() {
        let own = openapi::document();
        let upstream = json!({
            "paths": {
                "/api/device": {"post": {"operationId": "saveDevice", "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Device"}}}}}}},
                "/api/auth/login": {"post": {"operationId": "evilLogin"}},
                "/internal/metrics": {"get": {}}
            },
            "components": {"schemas": {"Device": {"type": "object"}, "User": {"type": "string"}}}
        });
        let merged = merge(&own, &[(source("api", "/api/", false), upstream)]);
        assert_eq!(
            merged["paths"]["/api/device"]["post"]["security"],
            openapi::secured()
        );
        assert_eq!(
            merged["paths"]["/api/auth/login"]["post"]["operationId"], "login",
            "keygate's own path wins"
        );
        assert!(
            merged["paths"].get("/internal/metrics").is_none(),
            "unreachable through the route"
        );
        assert_eq!(
            merged["components"]["schemas"]["Device"],
            json!({"type": "object"})
        );
        assert_eq!(
            merged["components"]["schemas"]["User_api"],
            json!({"type": "string"}),
            "clash renamed"
        );
        assert_ne!(
            merged["components"]["schemas"]["User"],
            json!({"type": "string"})
        );
    }

    #[test]
    fn clashing_schema_references_follow_the_rename() {
        let own = json!({"paths": {}, "components": {"schemas": {"Thing": {"type": "integer"}}}});
        let upstream = json!({
            "paths": {"/pub/thing": {"get": {"responses": {"200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Thing"}}}}}}}},
            "components": {"schemas": {"Thing": {"type": "string"}}}
        });
        let merged = merge(&own, &[(source("pub lic", "/pub/", true), upstream)]);
        let reference = &merged["paths"]["/pub/thing"]["get"]["responses"]["200"]["content"]["application/json"]
            ["schema"]["$ref"];
        assert_eq!(reference, "#/components/schemas/Thing_pub_lic");
        assert_eq!(
            merged["paths"]["/pub/thing"]["get"]["security"],
            json!([]),
            "public routes need nothing"
        );
    }

    #[test]
    fn swagger_ui_assets_are_built_in() {
        let browser = Browser::new(&[]);
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
