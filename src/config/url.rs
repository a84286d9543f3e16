//! URL settings: what each accepts, checked part by part.

/// What one URL setting accepts, beyond what every URL must be (see [`check_url`]).
pub(super) struct UrlRule {
    schemes: &'static [&'static str],
    /// A path other than `/` is allowed.
    path: bool,
    /// A query is allowed.
    query: bool,
    /// How the setting is written, for messages.
    example: &'static str,
}

/// A route's upstream: the base that request paths are appended to.
pub(super) const UPSTREAM_URL: UrlRule = UrlRule {
    schemes: &["http"],
    path: true,
    query: false,
    example: "http://host:port[/base-path]",
};

/// A route's `openapi` document, when written as a full URL.
pub(super) const OPENAPI_URL: UrlRule = UrlRule {
    schemes: &["http"],
    path: true,
    query: true,
    example: "http://host:port/path",
};

pub(super) const PUBLIC_BASE_URL: UrlRule = UrlRule {
    schemes: &["http", "https"],
    path: false,
    query: false,
    example: "https://host[:port]",
};

/// Checks an absolute URL part by part: a scheme the setting takes, a host,
/// a port (when one is written) that is a number from 1 to 65535, no user
/// name or password, no fragment, and a path or query only where the setting
/// takes one. The message names the first problem found, one per URL.
pub(super) fn check_url(text: &str, rule: &UrlRule) -> Result<http::Uri, String> {
    let schemes = rule.schemes.join(" or ");
    let example = rule.example;
    if text.contains(char::is_whitespace) {
        return Err(format!("must not contain spaces; write {example}"));
    }
    if text.contains('#') {
        return Err("must not have a fragment (#...)".into());
    }
    if !text.contains("://") {
        return Err(format!("missing scheme; write {example}"));
    }
    let uri: http::Uri = text
        .parse()
        .map_err(|e| format!("not a URL ({e}); write {example}"))?;
    match uri.scheme_str() {
        Some(scheme) if rule.schemes.contains(&scheme) => {}
        Some(other) => return Err(format!("scheme {other:?} is not supported; use {schemes}")),
        None => return Err(format!("missing scheme; write {example}")),
    }
    let authority = uri
        .authority()
        .map(http::uri::Authority::as_str)
        .unwrap_or("");
    if authority.contains('@') {
        return Err("must not contain a user name or password".into());
    }
    // The host is a bracketed IPv6 address or a name; the port follows the
    // last ':' after it.
    let (host, port) = match authority.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((v6, after)) => {
                if v6.parse::<std::net::Ipv6Addr>().is_err() {
                    return Err(format!("[{v6}] is not an IPv6 address"));
                }
                match after {
                    "" => (v6, None),
                    _ => match after.strip_prefix(':') {
                        Some(port) => (v6, Some(port)),
                        None => return Err(format!("unexpected {after:?} after the host")),
                    },
                }
            }
            None => return Err("unclosed '[' in the host".into()),
        },
        None => match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    if host.is_empty() {
        return Err(format!("missing host; write {example}"));
    }
    if !authority.starts_with('[')
        && !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    {
        return Err(format!("{host:?} is not a host name or address"));
    }
    if let Some(port) = port {
        let valid = !port.is_empty()
            && port.len() <= 5
            && port.bytes().all(|b| b.is_ascii_digit())
            && port.parse::<u32>().is_ok_and(|p| (1..=65_535).contains(&p));
        if !valid {
            return Err(format!("port {port:?} is not a number from 1 to 65535"));
        }
    }
    if !rule.path && uri.path() != "/" && !uri.path().is_empty() {
        return Err(format!("must not have a path; write {example}"));
    }
    if uri.query().is_some() && !rule.query {
        return Err(format!("must not have a query; write {example}"));
    }
    Ok(uri)
}

/// An upstream base URL: `http://host:port[/base-path]`.
pub(super) fn parse_upstream(text: &str) -> Result<http::Uri, String> {
    check_url(text.trim(), &UPSTREAM_URL)
}

/// An upstream's OpenAPI document: a path relative to the route's first
/// upstream (`/v3/api-docs`), or a full `http://` URL.
pub(super) fn openapi_url(text: &str, upstream: Option<&http::Uri>) -> Result<http::Uri, String> {
    if text.starts_with('/') {
        let base = upstream.ok_or("a path needs an upstream to resolve it against")?;
        let joined = format!("{}{text}", base.to_string().trim_end_matches('/'));
        return check_url(&joined, &OPENAPI_URL)
            .map_err(|e| format!("{e} (resolved as {joined:?})"));
    }
    check_url(text, &OPENAPI_URL)
}
