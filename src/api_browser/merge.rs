//! Joining keygate's OpenAPI document with the documents its upstreams
//! publish. Pure: no fetching, no logging, what clashed is reported.
//!
//! An upstream's paths are kept only where they route to that upstream
//! through keygate, and get keygate's security requirement (none on public
//! routes). Clashes resolve predictably: keygate's own paths and schemas win,
//! then upstreams in route order; a clashing schema of a later upstream is
//! renamed `<Name>_<route>` and its references follow. The joined document
//! names no server at all: upstream `servers` at path and operation level, in
//! callbacks and in links are removed, as are `$ref`s to anything outside the
//! document, so every call the page makes stays on keygate's origin.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::Source;
use crate::api::openapi;

/// Something an upstream document names that keygate's document (or an
/// earlier upstream's) already has.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Clash {
    /// A schema of the same name and another definition: the upstream's is
    /// renamed, and its references follow.
    Schema {
        route: String,
        name: String,
        renamed: String,
    },
    /// A path already documented: the first one is kept.
    Path { route: String, path: String },
}

/// The joined document and what clashed while joining it; each clash names
/// the index of the upstream document it came from.
pub struct Merged {
    pub document: Value,
    pub clashes: Vec<(usize, Clash)>,
}

/// Joins keygate's document with upstream documents (see the module docs),
/// reporting what clashed rather than logging it.
pub fn merge(own: &Value, upstreams: &[(Source, Value)]) -> Merged {
    let mut merged = own.clone();
    if let Some(map) = merged.as_object_mut() {
        // No server at the top either: Swagger UI uses the page's origin.
        map.remove("servers");
    }
    let mut clashes = Vec::new();
    for (index, (source, doc)) in upstreams.iter().enumerate() {
        let mut found = Vec::new();
        let mut doc = doc.clone();
        strip_external_refs(&mut doc);
        let renames = merge_schemas(&mut merged, &doc, source, &mut found);
        if !renames.is_empty() {
            rewrite_refs(&mut doc, &renames);
        }
        merge_paths(&mut merged, &doc, source, &mut found);
        merge_tags(&mut merged, &doc);
        clashes.extend(found.into_iter().map(|clash| (index, clash)));
    }
    Merged {
        document: merged,
        clashes,
    }
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

fn merge_schemas(
    merged: &mut Value,
    doc: &Value,
    source: &Source,
    clashes: &mut Vec<Clash>,
) -> BTreeMap<String, String> {
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
                clashes.push(Clash::Schema {
                    route: source.route.clone(),
                    name: name.clone(),
                    renamed: renamed.clone(),
                });
                renames.insert(name.clone(), renamed);
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
                        && let Some(renamed) = renames.get(target)
                    {
                        *child = Value::String(format!("#/components/schemas/{renamed}"));
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

fn merge_paths(merged: &mut Value, doc: &Value, source: &Source, clashes: &mut Vec<Clash>) {
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
            clashes.push(Clash::Path {
                route: source.route.clone(),
                path: path.clone(),
            });
            continue;
        }
        let mut item = item.clone();
        strip_servers(&mut item);
        for_each_operation(&mut item, &mut |op| {
            op.insert("security".into(), security.clone());
        });
        target.insert(path.clone(), item);
    }
}

/// The operations of a path item: the HTTP methods OpenAPI names, `query`
/// and `additionalOperations` of OpenAPI 3.2 included.
fn for_each_operation(item: &mut Value, apply: &mut dyn FnMut(&mut Map<String, Value>)) {
    let Some(item) = item.as_object_mut() else {
        return;
    };
    for (key, value) in item.iter_mut() {
        match key.as_str() {
            "get" | "put" | "post" | "delete" | "patch" | "head" | "options" | "trace"
            | "query" => {
                if let Some(op) = value.as_object_mut() {
                    apply(op);
                }
            }
            "additionalOperations" => {
                for op in value
                    .as_object_mut()
                    .into_iter()
                    .flat_map(|m| m.values_mut())
                {
                    if let Some(op) = op.as_object_mut() {
                        apply(op);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Removes every server an upstream's path item names, wherever OpenAPI lets
/// it name one: the path item's and each operation's `servers`, the path
/// items of its callbacks, and the `server` of the links in its responses.
/// Without them Swagger UI sends every call to the page's own origin, so a
/// hostile document cannot make the page send a credential elsewhere.
/// Schemas and examples are left alone: a property called `servers` is data.
pub fn strip_servers(item: &mut Value) {
    if let Some(map) = item.as_object_mut() {
        map.remove("servers");
    }
    for_each_operation(item, &mut |op| {
        op.remove("servers");
        if let Some(callbacks) = op.get_mut("callbacks").and_then(Value::as_object_mut) {
            for callback in callbacks.values_mut() {
                for path_item in callback
                    .as_object_mut()
                    .into_iter()
                    .flat_map(|m| m.values_mut())
                {
                    strip_servers(path_item);
                }
            }
        }
        if let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) {
            for response in responses.values_mut() {
                let links = response.get_mut("links").and_then(Value::as_object_mut);
                for link in links.into_iter().flat_map(|m| m.values_mut()) {
                    if let Some(link) = link.as_object_mut() {
                        link.remove("server");
                    }
                }
            }
        }
    });
}

/// Removes every `$ref` that points outside the document (`https://...`,
/// `other.json#/...`): Swagger UI would fetch it, and what it fetched could
/// name servers again. References inside the document (`#/...`) stay.
pub fn strip_external_refs(value: &mut Value) {
    match value {
        Value::Object(map) => {
            let external = map
                .get("$ref")
                .and_then(Value::as_str)
                .is_some_and(|r| !r.starts_with('#'));
            if external {
                map.remove("$ref");
            }
            map.values_mut().for_each(strip_external_refs);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_external_refs),
        _ => {}
    }
}

fn merge_tags(merged: &mut Value, doc: &Value) {
    let Some(tags) = doc.get("tags").and_then(Value::as_array) else {
        return;
    };
    if !merged.get("tags").is_some_and(Value::is_array)
        && let Some(map) = merged.as_object_mut()
    {
        map.insert("tags".into(), Value::Array(Vec::new()));
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
        let merged = merge(&own, &[(source("api", "/api/", false), upstream)]).document;
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
        let merged = merge(&own, &[(source("pub lic", "/pub/", true), upstream)]).document;
        let reference = &merged["paths"]["/pub/thing"]["get"]["responses"]["200"]["content"]["application/json"]
            ["schema"]["$ref"];
        assert_eq!(reference, "#/components/schemas/Thing_pub_lic");
        assert_eq!(
            merged["paths"]["/pub/thing"]["get"]["security"],
            json!([]),
            "public routes need nothing"
        );
    }

    /// Every string anywhere in `value` that names `origin`.
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

    const EVIL: &str = "https://attacker.example";

    fn hostile_path_item() -> Value {
        json!({
            "servers": [{"url": EVIL}],
            "parameters": [{"name": "id", "in": "path", "required": true}],
            "get": {
                "operationId": "steal",
                "servers": [{"url": format!("{EVIL}/op")}],
                "callbacks": {
                    "onEvent": {
                        "{$request.body#/callbackUrl}": {
                            "servers": [{"url": format!("{EVIL}/callback-item")}],
                            "post": {"servers": [{"url": format!("{EVIL}/callback-op")}], "responses": {}}
                        }
                    }
                },
                "responses": {
                    "200": {
                        "description": "ok",
                        "links": {"next": {"operationId": "steal", "server": {"url": format!("{EVIL}/link")}}},
                        "content": {"application/json": {"schema": {
                            "type": "object",
                            "properties": {"servers": {"type": "array"}, "server": {"type": "string"}}
                        }}}
                    }
                }
            },
            "additionalOperations": {
                "COPY": {"servers": [{"url": format!("{EVIL}/additional")}], "responses": {}}
            }
        })
    }

    #[test]
    fn strip_servers_removes_every_server_a_path_item_can_name() {
        let mut item = hostile_path_item();
        strip_servers(&mut item);
        assert_eq!(mentions(&item, EVIL), Vec::<String>::new(), "{item:#}");
        assert!(item.get("servers").is_none());
        assert!(item["get"].get("servers").is_none());
        assert!(
            item["get"]["responses"]["200"]["links"]["next"]
                .get("server")
                .is_none()
        );
        assert_eq!(
            item["get"]["responses"]["200"]["links"]["next"]["operationId"],
            "steal"
        );
        assert_eq!(item["get"]["operationId"], "steal", "the rest stays");
        assert_eq!(item["parameters"][0]["name"], "id");
    }

    #[test]
    fn strip_servers_keeps_schema_properties_called_servers() {
        let mut item = hostile_path_item();
        strip_servers(&mut item);
        let properties =
            &item["get"]["responses"]["200"]["content"]["application/json"]["schema"]["properties"];
        assert_eq!(properties["servers"], json!({"type": "array"}));
        assert_eq!(properties["server"], json!({"type": "string"}));
    }

    #[test]
    fn strip_external_refs_keeps_references_inside_the_document() {
        let mut doc = json!({
            "paths": {
                "/api/a": {"$ref": format!("{EVIL}/paths.json#/a")},
                "/api/b": {"get": {"responses": {"200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/B"}}}}}}}
            },
            "components": {"schemas": {"B": {"properties": {"c": {"$ref": "other.json#/C"}}}}}
        });
        strip_external_refs(&mut doc);
        assert_eq!(mentions(&doc, EVIL), Vec::<String>::new());
        assert!(
            doc["components"]["schemas"]["B"]["properties"]["c"]
                .get("$ref")
                .is_none()
        );
        assert_eq!(
            doc["paths"]["/api/b"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
                ["$ref"],
            "#/components/schemas/B"
        );
    }

    #[test]
    fn hostile_upstream_servers_never_reach_the_merged_document() {
        let mut own = openapi::document();
        own["servers"] = json!([{"url": format!("{EVIL}/own")}]);
        let upstream = json!({
            "servers": [{"url": EVIL}],
            "paths": {
                "/api/steal/{id}": hostile_path_item(),
                "/api/elsewhere": {"$ref": format!("{EVIL}/more.json#/paths/x")}
            },
            "components": {
                "schemas": {"Loot": {"$ref": format!("{EVIL}/loot.json")}},
                "links": {"away": {"server": {"url": EVIL}}},
                "callbacks": {"away": {"{$url}": {"servers": [{"url": EVIL}]}}}
            },
            "webhooks": {"w": {"servers": [{"url": EVIL}]}}
        });
        let merged = merge(&own, &[(source("api", "/api/", false), upstream)]).document;
        assert_eq!(mentions(&merged, EVIL), Vec::<String>::new(), "{merged:#}");
        assert!(merged.get("servers").is_none());
        assert_eq!(
            merged["paths"]["/api/steal/{id}"]["get"]["security"],
            openapi::secured(),
            "the operation is still there, with keygate's security"
        );
    }
}
