//! URL settings: what each accepts, checked part by part.

use std::fmt;
use std::str::FromStr;

use http::uri::{Authority, Scheme};

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
    schemes: &["http", "https"],
    path: true,
    query: false,
    example: "http[s]://host[:port][/base-path]",
};

/// A route's `openapi` document, when written as a full URL.
pub(super) const OPENAPI_URL: UrlRule = UrlRule {
    schemes: &["http", "https"],
    path: true,
    query: true,
    example: "http[s]://host[:port]/path",
};

/// An OpenID Connect provider's issuer (`[[oidc]] issuer`); `http` only for
/// a loopback host, which [`super::oidc::check_issuer`] checks.
pub(super) const ISSUER_URL: UrlRule = UrlRule {
    schemes: &["https", "http"],
    path: true,
    query: false,
    example: "https://host[:port][/path]",
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
    check_authority(authority, example)?;
    if !rule.path && uri.path() != "/" && !uri.path().is_empty() {
        return Err(format!("must not have a path; write {example}"));
    }
    if uri.query().is_some() && !rule.query {
        return Err(format!("must not have a query; write {example}"));
    }
    Ok(uri)
}

/// Checks the `host[:port]` part: no user name or password, a bracketed IPv6
/// address or a host name, and a port from 1 to 65535 when one is written.
fn check_authority(authority: &str, example: &str) -> Result<(), String> {
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
    Ok(())
}

/// A route's upstream as validated: requests go to `scheme://authority`, with
/// the base path before their own. Made only by parsing (`"...".parse()`),
/// which checks it as `[[route]] upstreams` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    scheme: Scheme,
    authority: Authority,
    /// Without a trailing slash; empty for none.
    base_path: String,
}

impl UpstreamUrl {
    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// Spoken to over TLS (`https://`).
    pub fn is_https(&self) -> bool {
        self.scheme == Scheme::HTTPS
    }

    /// The port connected to: the written one, else the scheme's (80, 443).
    pub fn port(&self) -> u16 {
        self.authority
            .port_u16()
            .unwrap_or(if self.is_https() { 443 } else { 80 })
    }

    /// The host, without the brackets of an IPv6 address.
    pub fn host(&self) -> &str {
        let host = self.authority.host();
        host.strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
    }

    /// The path request paths are appended to, without a trailing slash;
    /// empty when the upstream has none.
    pub(crate) fn base_path(&self) -> &str {
        &self.base_path
    }
}

impl FromStr for UpstreamUrl {
    type Err = String;

    /// An upstream base URL: `http[s]://host[:port][/base-path]`.
    fn from_str(text: &str) -> Result<UpstreamUrl, String> {
        let uri = check_url(text.trim(), &UPSTREAM_URL)?;
        let missing_host = || format!("missing host; write {}", UPSTREAM_URL.example);
        Ok(UpstreamUrl {
            scheme: uri.scheme().cloned().unwrap_or(Scheme::HTTP),
            authority: uri.authority().cloned().ok_or_else(missing_host)?,
            base_path: uri.path().trim_end_matches('/').to_string(),
        })
    }
}

/// `scheme://authority[/base-path]`, without a trailing slash: the label
/// metrics and logs name the upstream by.
impl fmt::Display for UpstreamUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.authority, self.base_path)
    }
}

/// An upstream's OpenAPI document: a path relative to the route's first
/// upstream (`/v3/api-docs`), or a full `http://` or `https://` URL.
pub(super) fn openapi_url(text: &str, upstream: Option<&UpstreamUrl>) -> Result<http::Uri, String> {
    if text.starts_with('/') {
        let base = upstream.ok_or("a path needs an upstream to resolve it against")?;
        let joined = format!("{base}{text}");
        return check_url(&joined, &OPENAPI_URL)
            .map_err(|e| format!("{e} (resolved as {joined:?})"));
    }
    check_url(text, &OPENAPI_URL)
}

/// A URL fit for a message or log: a password in it (`user:secret@host`)
/// is replaced by `***`; the rest is kept.
pub fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod redaction_tests {
    use super::redacted_url;

    #[test]
    fn a_password_in_a_url_is_never_shown() {
        assert_eq!(
            redacted_url("postgres://kg:s3cret@db:5432/keygate?sslmode=require"),
            "postgres://kg:***@db:5432/keygate?sslmode=require"
        );
        assert_eq!(
            redacted_url("redis://:pw@cache:6379/0"),
            "redis://:***@cache:6379/0"
        );
        assert_eq!(
            redacted_url("sqlite://data/keygate.db"),
            "sqlite://data/keygate.db"
        );
        assert_eq!(
            redacted_url("postgres://kg@db/keygate"),
            "postgres://kg@db/keygate"
        );
    }
}
