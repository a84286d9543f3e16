//! Scoped API keys: the grants a key is limited to, how they are read and
//! checked, and how one set of grants covers another.
//!
//! A grant is a path prefix and a set of methods. A request is allowed when
//! one grant holds its method and its normalised path (the one that decided
//! its route) lies under the grant's path at a segment boundary: `/api/device`
//! holds `/api/device` and `/api/device/x`, never `/api/devices`; a grant path
//! ending in `/` holds what is below it, and `/` holds every path. `HEAD` is
//! allowed wherever `GET` is.
//!
//! A grant's path is refused, not repaired, when it could mean something
//! other than what it says: dot segments, an empty segment (`//`), `%`, `?`,
//! `#`, `;`, `\`, or a byte outside printable ASCII.

use std::fmt;

use http::Method;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The methods a grant can hold, in the order they are shown.
const METHODS: [(&str, u8); 7] = [
    ("GET", 1),
    ("HEAD", 1 << 1),
    ("POST", 1 << 2),
    ("PUT", 1 << 3),
    ("PATCH", 1 << 4),
    ("DELETE", 1 << 5),
    ("OPTIONS", 1 << 6),
];
const GET: u8 = 1;
const HEAD: u8 = 1 << 1;

/// A set of methods, one bit each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Methods(u8);

impl Methods {
    fn bit_of(name: &str) -> Option<u8> {
        METHODS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, bit)| *bit)
    }

    /// The bit of a request's method; 0 for one no grant can hold.
    fn of_request(method: &Method) -> u8 {
        match *method {
            Method::GET => GET,
            Method::HEAD => HEAD,
            Method::POST => 1 << 2,
            Method::PUT => 1 << 3,
            Method::PATCH => 1 << 4,
            Method::DELETE => 1 << 5,
            Method::OPTIONS => 1 << 6,
            _ => 0,
        }
    }

    /// What the grant allows: its methods, and `HEAD` with `GET`.
    fn allowed(self) -> u8 {
        if self.0 & GET != 0 {
            self.0 | HEAD
        } else {
            self.0
        }
    }

    fn names(self) -> impl Iterator<Item = &'static str> {
        METHODS
            .iter()
            .filter(move |(_, bit)| self.0 & bit != 0)
            .map(|(name, _)| *name)
    }
}

/// One grant: a path prefix and the methods allowed under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    path: Box<str>,
    methods: Methods,
}

impl Grant {
    /// The grant of `methods` under `path`, as an API body would give it.
    pub fn new(path: &str, methods: &[&str]) -> Result<Grant, ScopeError> {
        let raw = RawGrant {
            path: Some(serde_json::Value::from(path)),
            methods: Some(serde_json::Value::from(methods.to_vec())),
        };
        Grant::parse(0, raw)
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// The methods as written: upper case, each once, in a fixed order.
    pub fn methods(&self) -> Vec<&'static str> {
        self.methods.names().collect()
    }

    /// Does this grant allow `method` on the normalised `path`?
    pub fn allows(&self, method: &Method, path: &str) -> bool {
        self.methods.allowed() & Methods::of_request(method) != 0 && under(&self.path, path)
    }

    /// Does every request `other` allows lie within this grant: the same or a
    /// narrower path, and a subset of the methods?
    pub fn covers(&self, other: &Grant) -> bool {
        let methods = self.methods.allowed();
        other.methods.allowed() & !methods == 0 && path_covers(&self.path, &other.path)
    }

    fn parse(index: usize, raw: RawGrant) -> Result<Grant, ScopeError> {
        let field = |name: &str| format!("scopes[{index}].{name}");
        let path = match raw.path {
            None => return Err(ScopeError(format!("{}: missing", field("path")))),
            Some(serde_json::Value::String(path)) => path,
            Some(_) => return Err(ScopeError(format!("{}: must be a string", field("path")))),
        };
        check_path(&path).map_err(|why| ScopeError(format!("{}: {why}", field("path"))))?;
        let list = match raw.methods {
            None => return Err(ScopeError(format!("{}: missing", field("methods")))),
            Some(serde_json::Value::Array(list)) => list,
            Some(_) => return Err(ScopeError(format!("{}: must be a list", field("methods")))),
        };
        if list.is_empty() {
            return Err(ScopeError(format!(
                "{}: must name at least one method",
                field("methods")
            )));
        }
        let mut methods = 0;
        for (i, method) in list.iter().enumerate() {
            let bit = method
                .as_str()
                .and_then(|name| Methods::bit_of(&name.to_ascii_uppercase()));
            match bit {
                Some(bit) => methods |= bit,
                None => {
                    return Err(ScopeError(format!(
                        "scopes[{index}].methods[{i}]: unknown method {method}"
                    )));
                }
            }
        }
        Ok(Grant {
            path: path.into(),
            methods: Methods(methods),
        })
    }
}

/// Is the normalised request `path` under the grant path `prefix`?
fn under(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        None => false,
        Some(rest) => prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/'),
    }
}

/// Does the grant path `outer` hold every path the grant path `inner` holds?
fn path_covers(outer: &str, inner: &str) -> bool {
    if outer.ends_with('/') {
        inner.starts_with(outer)
    } else {
        under(outer, inner)
    }
}

/// Why a grant path is refused, if it is.
fn check_path(path: &str) -> Result<(), &'static str> {
    if !path.starts_with('/') {
        return Err("must start with '/'");
    }
    if path.len() > 1024 {
        return Err("must be at most 1024 characters");
    }
    if let Some(c) = path
        .chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, '%' | '?' | '#' | ';' | '\\'))
    {
        return Err(match c {
            '%' => "must not contain '%' (write the path as the gateway sees it, decoded)",
            '?' | '#' => "must not contain a query or fragment",
            ';' => "must not contain ';'",
            '\\' => "must not contain '\\'",
            _ => "must be printable ASCII without spaces",
        });
    }
    let inner = path[1..].strip_suffix('/').unwrap_or(&path[1..]);
    if path.len() > 1 && inner.split('/').any(str::is_empty) {
        return Err("must not contain an empty segment ('//')");
    }
    if inner.split('/').any(|s| s == "." || s == "..") {
        return Err("must not contain '.' or '..' segments");
    }
    Ok(())
}

/// A grant as a body gives it, read field by field so each error names its field.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGrant {
    path: Option<serde_json::Value>,
    methods: Option<serde_json::Value>,
}

/// A malformed scope, naming the field (`scopes[1].methods[0]: ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeError(pub String);

impl fmt::Display for ScopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ScopeError {}

/// What a request does, whatever its method: the class a scoped key's check
/// reads before its grants. Every endpoint keygate answers has one in its
/// route table (`api::ROUTES`); a forwarded request is a credential when its
/// path is one of the platform's credential endpoints
/// (`api::proxied_effect`), and otherwise the upstream's to define.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Reads what it names and changes nothing.
    Read,
    /// Changes what it names, but no credential.
    Write,
    /// Mints, reveals, replaces or removes a credential: a password, a
    /// token pair, an activation or reset link, an API key, a second factor,
    /// an account's enabled flag. Never reached with a scoped key, whatever
    /// its grants say.
    Credential,
    /// Forwarded to an upstream, which defines what it does: the grant of
    /// its method and path decides.
    Upstream,
}

impl Scopes {
    /// The one scope check of every path a scoped key takes (an endpoint,
    /// a forwarded request, a WebSocket): a credential is refused whatever
    /// the grants say; anything else needs a grant of `method` on the
    /// normalised `path`.
    pub fn permit(&self, effect: Effect, method: &Method, path: &str) -> bool {
        effect != Effect::Credential && self.allows(method, path)
    }
}

/// A key's grants: at least one. A key without scopes has its owner's full
/// rights and no `Scopes` at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scopes {
    grants: Box<[Grant]>,
}

impl Scopes {
    /// At most this many grants per key: the check walks them all.
    pub const MAX_GRANTS: usize = 64;

    /// The read-only shortcut: `GET` (and `HEAD`) on every path.
    pub fn read_only() -> Scopes {
        Scopes {
            grants: Box::new([Grant {
                path: "/".into(),
                methods: Methods(GET),
            }]),
        }
    }

    pub fn new(grants: Vec<Grant>) -> Result<Scopes, ScopeError> {
        if grants.is_empty() {
            return Err(ScopeError("scopes: must hold at least one grant".into()));
        }
        if grants.len() > Self::MAX_GRANTS {
            return Err(ScopeError(format!(
                "scopes: at most {} grants",
                Self::MAX_GRANTS
            )));
        }
        Ok(Scopes {
            grants: grants.into(),
        })
    }

    /// Reads scopes from a JSON value: a list of `{"path", "methods"}`.
    pub fn from_json(value: &serde_json::Value) -> Result<Scopes, ScopeError> {
        let serde_json::Value::Array(list) = value else {
            return Err(ScopeError("scopes: must be a list of grants".into()));
        };
        let grants = list
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let serde_json::Value::Object(_) = item else {
                    return Err(ScopeError(format!(
                        "scopes[{i}]: must be an object with path and methods"
                    )));
                };
                let raw = RawGrant::deserialize(item)
                    .map_err(|e| ScopeError(format!("scopes[{i}]: {e}")))?;
                Grant::parse(i, raw)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Scopes::new(grants)
    }

    /// Reads scopes as stored (JSON text).
    pub fn from_stored(text: &str) -> Result<Scopes, ScopeError> {
        let value = serde_json::from_str(text).map_err(|e| ScopeError(e.to_string()))?;
        Scopes::from_json(&value)
    }

    /// The JSON text they are stored as.
    pub fn to_stored(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn grants(&self) -> &[Grant] {
        &self.grants
    }

    /// Does one grant allow `method` on the normalised `path`?
    pub fn allows(&self, method: &Method, path: &str) -> bool {
        self.grants.iter().any(|grant| grant.allows(method, path))
    }

    /// Does every grant of `other` lie within one of these?
    pub fn covers(&self, other: &Scopes) -> bool {
        other
            .grants
            .iter()
            .all(|inner| self.grants.iter().any(|outer| outer.covers(inner)))
    }
}

impl fmt::Display for Scopes {
    /// `GET,POST /api/device/; GET /api/auth/user`, as the command line takes them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, grant) in self.grants.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{} {}", grant.methods().join(","), grant.path)?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Grant {
    type Err = ScopeError;

    /// `METHOD[,METHOD...] /path`, as the command line's `--scope` takes it.
    fn from_str(text: &str) -> Result<Grant, ScopeError> {
        let (methods, path) = text.trim().split_once(' ').ok_or_else(|| {
            ScopeError(format!(
                "scope {text:?}: expected 'METHOD[,METHOD...] /path'"
            ))
        })?;
        let methods: Vec<&str> = methods.split(',').map(str::trim).collect();
        Grant::new(path.trim(), &methods)
    }
}

#[derive(Serialize)]
struct GrantOut<'a> {
    path: &'a str,
    methods: Vec<&'static str>,
}

impl Serialize for Scopes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.grants.iter().map(|grant| GrantOut {
            path: &grant.path,
            methods: grant.methods(),
        }))
    }
}

impl<'de> Deserialize<'de> for Scopes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Scopes, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        Scopes::from_json(&value).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn scopes(value: serde_json::Value) -> Scopes {
        Scopes::from_json(&value).unwrap()
    }

    fn error(value: serde_json::Value) -> String {
        Scopes::from_json(&value).unwrap_err().0
    }

    #[test]
    fn a_grant_path_matches_at_segment_boundaries_only() {
        let s = scopes(json!([{"path": "/api/device", "methods": ["GET"]}]));
        assert!(s.allows(&Method::GET, "/api/device"));
        assert!(s.allows(&Method::GET, "/api/device/"));
        assert!(s.allows(&Method::GET, "/api/device/abc/credentials"));
        assert!(!s.allows(&Method::GET, "/api/devices"));
        assert!(!s.allows(&Method::GET, "/api/devic"));
        assert!(!s.allows(&Method::GET, "/api"));
        assert!(!s.allows(&Method::POST, "/api/device"));
    }

    #[test]
    fn a_grant_path_ending_in_a_slash_matches_below_it() {
        let s = scopes(json!([{"path": "/api/device/", "methods": ["POST"]}]));
        assert!(s.allows(&Method::POST, "/api/device/x"));
        assert!(s.allows(&Method::POST, "/api/device/"));
        assert!(!s.allows(&Method::POST, "/api/device"));
        assert!(!s.allows(&Method::POST, "/api/devices/x"));
        let all = scopes(json!([{"path": "/", "methods": ["DELETE"]}]));
        assert!(all.allows(&Method::DELETE, "/"));
        assert!(all.allows(&Method::DELETE, "/api/anything/at/all"));
    }

    #[test]
    fn head_is_allowed_wherever_get_is_and_only_there() {
        let s = scopes(json!([{"path": "/api/a", "methods": ["get"]}]));
        assert!(s.allows(&Method::HEAD, "/api/a/1"));
        let post = scopes(json!([{"path": "/api/a", "methods": ["POST"]}]));
        assert!(!post.allows(&Method::HEAD, "/api/a/1"));
        assert!(!s.allows(&Method::TRACE, "/api/a/1"));
        assert!(!s.allows(&Method::CONNECT, "/api/a/1"));
    }

    #[test]
    fn methods_are_upper_cased_and_each_kept_once() {
        let s = scopes(json!([{"path": "/x", "methods": ["post", "GET", "get", "Post"]}]));
        assert_eq!(s.grants()[0].methods(), vec!["GET", "POST"]);
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            json!([{"path": "/x", "methods": ["GET", "POST"]}])
        );
        assert_eq!(Scopes::from_stored(&s.to_stored()).unwrap(), s);
    }

    #[test]
    fn every_malformed_scope_names_its_field() {
        assert_eq!(
            error(json!({"path": "/"})),
            "scopes: must be a list of grants"
        );
        assert_eq!(error(json!([])), "scopes: must hold at least one grant");
        assert!(error(json!(["GET /"])).starts_with("scopes[0]: must be an object"));
        assert_eq!(
            error(json!([{"methods": ["GET"]}])),
            "scopes[0].path: missing"
        );
        assert_eq!(error(json!([{"path": "/"}])), "scopes[0].methods: missing");
        assert_eq!(
            error(json!([{"path": "/", "methods": ["GET"]}, {"path": "api", "methods": ["GET"]}])),
            "scopes[1].path: must start with '/'"
        );
        assert_eq!(
            error(json!([{"path": "/", "methods": ["GET", "FETCH"]}])),
            "scopes[0].methods[1]: unknown method \"FETCH\""
        );
        assert_eq!(
            error(json!([{"path": "/", "methods": [7]}])),
            "scopes[0].methods[0]: unknown method 7"
        );
        assert_eq!(
            error(json!([{"path": "/", "methods": []}])),
            "scopes[0].methods: must name at least one method"
        );
        assert_eq!(
            error(json!([{"path": "/", "methods": "GET"}])),
            "scopes[0].methods: must be a list"
        );
        assert_eq!(
            error(json!([{"path": 5, "methods": ["GET"]}])),
            "scopes[0].path: must be a string"
        );
        assert!(
            error(json!([{"path": "/", "methods": ["GET"], "extra": 1}]))
                .starts_with("scopes[0]: unknown field `extra`")
        );
        let many: Vec<_> = (0..65)
            .map(|_| json!({"path": "/", "methods": ["GET"]}))
            .collect();
        assert_eq!(error(json!(many)), "scopes: at most 64 grants");
    }

    #[test]
    fn grant_paths_that_could_mean_something_else_are_refused() {
        for path in [
            "/api/../x",
            "/api/./x",
            "/..",
            "/api//x",
            "//",
            "/api/%2e%2e",
            "/api/x?y",
            "/api/x#y",
            "/api/x;y",
            "/api\\x",
            "/api/x y",
            "/api/\u{e9}",
        ] {
            let value = json!([{"path": path, "methods": ["GET"]}]);
            assert!(
                error(value).starts_with("scopes[0].path: "),
                "{path} was accepted"
            );
        }
        for path in ["/", "/api", "/api/", "/api/device/x.y", "/api/..x/"] {
            scopes(json!([{"path": path, "methods": ["GET"]}]));
        }
    }

    #[test]
    fn covers_means_a_narrower_or_equal_path_and_a_subset_of_methods() {
        let outer = Grant::new("/api/device", &["GET", "POST"]).unwrap();
        assert!(outer.covers(&Grant::new("/api/device", &["GET"]).unwrap()));
        assert!(outer.covers(&Grant::new("/api/device/", &["GET", "HEAD"]).unwrap()));
        assert!(outer.covers(&Grant::new("/api/device/x", &["POST"]).unwrap()));
        assert!(!outer.covers(&Grant::new("/api/devices", &["GET"]).unwrap()));
        assert!(!outer.covers(&Grant::new("/api", &["GET"]).unwrap()));
        assert!(!outer.covers(&Grant::new("/api/device", &["DELETE"]).unwrap()));
        let below = Grant::new("/api/device/", &["GET"]).unwrap();
        assert!(!below.covers(&Grant::new("/api/device", &["GET"]).unwrap()));
        assert!(below.covers(&Grant::new("/api/device/x", &["GET"]).unwrap()));
        let head = Grant::new("/x", &["HEAD"]).unwrap();
        assert!(!head.covers(&Grant::new("/x", &["GET"]).unwrap()));
    }

    #[test]
    fn the_command_line_form_reads_and_shows_the_same_grants() {
        let grant: Grant = "GET,post /api/device/".parse().unwrap();
        assert_eq!(grant, Grant::new("/api/device/", &["POST", "GET"]).unwrap());
        let s = Scopes::new(vec![grant, "DELETE /api/x".parse().unwrap()]).unwrap();
        assert_eq!(s.to_string(), "GET,POST /api/device/; DELETE /api/x");
        assert!("GET".parse::<Grant>().is_err());
        assert!("FETCH /x".parse::<Grant>().is_err());
        assert_eq!(Scopes::read_only().to_string(), "GET /");
    }

    /// The reference: what a grant allows, written the plain way, by
    /// segments.
    fn reference_allows(grant_path: &str, methods: &[&str], method: &str, path: &str) -> bool {
        let method_ok = methods.contains(&method) || (method == "HEAD" && methods.contains(&"GET"));
        if !method_ok {
            return false;
        }
        if grant_path == "/" {
            return true;
        }
        let grant_segments: Vec<&str> = grant_path.trim_end_matches('/').split('/').collect();
        let path_segments: Vec<&str> = path.split('/').collect();
        if path_segments.len() < grant_segments.len()
            || path_segments[..grant_segments.len()] != grant_segments[..]
        {
            return false;
        }
        // A grant ending in '/' holds only what is below it.
        !grant_path.ends_with('/') || path_segments.len() > grant_segments.len()
    }

    fn segment() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("api".to_string()),
            Just("device".to_string()),
            Just("devices".to_string()),
            Just("dev".to_string()),
            Just(String::new()),
            "[a-c.]{1,3}",
        ]
    }

    fn request_path() -> impl Strategy<Value = String> {
        prop::collection::vec(segment(), 0..5).prop_map(|s| format!("/{}", s.join("/")))
    }

    fn grant_path() -> impl Strategy<Value = String> {
        (prop::collection::vec(segment(), 0..4), any::<bool>()).prop_map(|(s, slash)| {
            let mut path = format!("/{}", s.join("/"));
            if slash && !path.ends_with('/') {
                path.push('/');
            }
            path
        })
    }

    fn method_names() -> impl Strategy<Value = Vec<&'static str>> {
        prop::collection::vec(
            prop::sample::select(METHODS.to_vec()).prop_map(|(n, _)| n),
            1..4,
        )
    }

    proptest! {
        #[test]
        fn the_matcher_never_allows_what_the_reference_refuses(
            grant_path in grant_path(),
            methods in method_names(),
            method in prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"]),
            path in request_path(),
        ) {
            let Ok(grant) = Grant::new(&grant_path, &methods) else {
                return Ok(());
            };
            let request_method: Method = method.parse().unwrap();
            prop_assert_eq!(
                grant.allows(&request_method, &path),
                reference_allows(&grant_path, &methods, method, &path),
                "{} {:?} vs {} {}", grant_path, methods, method, path
            );
        }

        #[test]
        fn a_covered_grant_never_allows_what_its_cover_refuses(
            outer_path in grant_path(),
            outer_methods in method_names(),
            inner_path in grant_path(),
            inner_methods in method_names(),
            method in prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]),
            path in request_path(),
        ) {
            let (Ok(outer), Ok(inner)) = (
                Grant::new(&outer_path, &outer_methods),
                Grant::new(&inner_path, &inner_methods),
            ) else {
                return Ok(());
            };
            let request_method: Method = method.parse().unwrap();
            if outer.covers(&inner) && inner.allows(&request_method, &path) {
                prop_assert!(outer.allows(&request_method, &path));
            }
        }
    }
}
