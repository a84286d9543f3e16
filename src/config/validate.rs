//! Validation of the raw sections into the runtime settings.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use ipnet::IpNet;

use super::file::{FileConfig, JwtSection, RetentionSection, RouteSection};
use super::url::{PUBLIC_BASE_URL, check_url, openapi_url, parse_upstream};
use super::*;

/// Largest `retention.batch_size`: one statement stays short.
const MAX_PRUNE_BATCH: i64 = 100_000;

pub(super) fn validate(file: &FileConfig, errors: &mut Vec<String>) -> Settings {
    let mut duration = |name: &str, text: &str| match parse_duration(text) {
        Ok(d) if !d.is_zero() => d,
        Ok(_) => {
            errors.push(format!("{name}: must be greater than zero"));
            Duration::from_secs(1)
        }
        Err(e) => {
            errors.push(format!("{name}: {e}"));
            Duration::from_secs(1)
        }
    };
    let shutdown_grace = duration("server.shutdown_grace", &file.server.shutdown_grace);
    let cache = CacheSettings {
        capacity: 0,
        ttl: duration("cache.ttl", &file.cache.ttl),
        negative_ttl: duration("cache.negative_ttl", &file.cache.negative_ttl),
    };
    let connect_timeout = duration("proxy.connect_timeout", &file.proxy.connect_timeout);
    let request_timeout = duration("proxy.request_timeout", &file.proxy.request_timeout);
    let pool_idle_timeout = duration("proxy.pool_idle_timeout", &file.proxy.pool_idle_timeout);
    let upstream_retry_after = duration(
        "proxy.upstream_retry_after",
        &file.proxy.upstream_retry_after,
    );
    let header_read_timeout = duration(
        "limits.header_read_timeout",
        &file.limits.header_read_timeout,
    );
    let tls_handshake_timeout = duration(
        "limits.tls_handshake_timeout",
        &file.limits.tls_handshake_timeout,
    );
    let idle_timeout = duration("limits.idle_timeout", &file.limits.idle_timeout);
    let body_read_timeout = duration("limits.body_read_timeout", &file.limits.body_read_timeout);
    let http2_keep_alive_interval = duration(
        "limits.http2_keep_alive_interval",
        &file.limits.http2_keep_alive_interval,
    );
    let http2_keep_alive_timeout = duration(
        "limits.http2_keep_alive_timeout",
        &file.limits.http2_keep_alive_timeout,
    );
    let browser_refresh = duration("api_browser.refresh", &file.api_browser.refresh);
    let browser_fetch_timeout =
        duration("api_browser.fetch_timeout", &file.api_browser.fetch_timeout);
    let account_window = duration("login.account_window", &file.login.account_window);
    let address_window = duration("login.address_window", &file.login.address_window);

    let mut positive = |name: &str, n: i64| -> u64 {
        if n <= 0 {
            errors.push(format!("{name}: must be a positive integer, got {n}"));
            1
        } else {
            n as u64
        }
    };
    let max_connections = positive("listen.max_connections", file.listen.max_connections) as usize;
    let max_connections_per_address = positive(
        "listen.max_connections_per_address",
        file.listen.max_connections_per_address,
    ) as usize;
    let admin_max_connections = positive(
        "listen.admin_max_connections",
        file.listen.admin_max_connections,
    ) as usize;
    let store_max_connections =
        positive("store.max_connections", file.store.max_connections) as u32;
    let capacity = positive("cache.capacity", file.cache.capacity);
    let pool_max_idle_per_host = positive(
        "proxy.pool_max_idle_per_host",
        file.proxy.pool_max_idle_per_host,
    ) as usize;
    let max_header_bytes =
        positive("limits.max_header_bytes", file.limits.max_header_bytes) as usize;
    let max_body_bytes = positive("limits.max_body_bytes", file.limits.max_body_bytes);
    let account_max_failures = positive(
        "login.account_max_failures",
        file.login.account_max_failures,
    );
    let account_address_max_failures = positive(
        "login.account_address_max_failures",
        file.login.account_address_max_failures,
    );
    let address_max_failures = positive(
        "login.address_max_failures",
        file.login.address_max_failures,
    );
    let limiter_capacity = positive("login.limiter_capacity", file.login.limiter_capacity);
    let password_min_length = positive("login.password_min_length", file.login.password_min_length);
    let password_max_length = positive("login.password_max_length", file.login.password_max_length);
    if password_min_length > password_max_length {
        errors.push("login.password_min_length: must not exceed login.password_max_length".into());
    }
    if file.login.lockout_after < 0 || file.login.max_concurrent_hashes < 0 {
        errors.push(
            "login.lockout_after and login.max_concurrent_hashes: must not be negative".into(),
        );
    }
    let max_concurrent_hashes = match file.login.max_concurrent_hashes {
        n if n > 0 => n as usize,
        // Auto: half the cores, so logins never take every core from proxying.
        _ => std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
    };

    let listen = Listen {
        https: optional_addr("listen.https", &file.listen.https, errors),
        http: optional_addr("listen.http", &file.listen.http, errors),
        admin: optional_addr("listen.admin", &file.listen.admin, errors),
        max_connections,
        allow_plaintext_credentials: file.listen.allow_plaintext_credentials,
        max_connections_per_address,
        max_connections_per_trusted_proxy: match file.listen.max_connections_per_trusted_proxy {
            0 => None,
            n if n > 0 => Some(n as usize),
            n => {
                errors.push(format!(
                    "listen.max_connections_per_trusted_proxy: must not be negative, got {n}"
                ));
                None
            }
        },
        admin_max_connections,
    };
    if file.listen.https.trim().is_empty() && file.listen.http.trim().is_empty() {
        errors.push("listen: at least one of https and http must be set".into());
    }
    if max_header_bytes < 1024 {
        errors.push("limits.max_header_bytes: must be at least 1024".into());
    }

    let tls_files = match (file.tls.cert.trim(), file.tls.key.trim()) {
        ("", "") => None,
        (cert, key) if !cert.is_empty() && !key.is_empty() => {
            for (name, path) in [("tls.cert", cert), ("tls.key", key)] {
                if !Path::new(path).is_file() {
                    errors.push(format!("{name}: file {path:?} does not exist"));
                }
            }
            Some((PathBuf::from(cert), PathBuf::from(key)))
        }
        _ => {
            errors.push("tls: cert and key must both be set, or both left empty".into());
            None
        }
    };

    let store_url = file.store.url.trim().to_string();
    if !(store_url.starts_with("sqlite:")
        || store_url.starts_with("postgres://")
        || store_url.starts_with("postgresql://"))
    {
        errors.push(format!(
            "store.url: must start with sqlite:, postgres:// or postgresql://, got {store_url:?}"
        ));
    }

    let jwt = validate_jwt(&file.jwt, errors);
    let retention = validate_retention(&file.retention, errors);

    let prefix = &file.api_keys.prefix;
    if prefix.len() > 16
        || !prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        errors.push(format!(
            "api_keys.prefix: at most 16 characters of [A-Za-z0-9_-], got {prefix:?}"
        ));
    }

    let mut trusted_proxies = Vec::new();
    for cidr in &file.proxy.trusted_proxies {
        match parse_cidr(cidr) {
            Some(net) => trusted_proxies.push(net),
            None => errors.push(format!(
                "proxy.trusted_proxies: {cidr:?} is not a CIDR or IP address"
            )),
        }
    }

    let format = match file.log.format.as_str() {
        "human" => LogFormat::Human,
        "json" => LogFormat::Json,
        other => {
            errors.push(format!(
                "log.format: must be \"human\" or \"json\", got {other:?}"
            ));
            LogFormat::Human
        }
    };

    let routes = validate_routes(&file.routes, request_timeout, errors);
    let public_base_url = public_base_url(&file.server.public_base_url, errors);

    Settings {
        data_dir: PathBuf::from(&file.server.data_dir),
        shutdown_grace,
        public_base_url,
        listen,
        tls_files,
        store_url,
        store_max_connections,
        retention,
        jwt,
        api_key_prefix: prefix.clone(),
        disable_key_on_plaintext: file.api_keys.disable_on_plaintext,
        cache: CacheSettings { capacity, ..cache },
        proxy: ProxySettings {
            trusted_proxies,
            connect_timeout,
            request_timeout,
            pool_idle_timeout,
            pool_max_idle_per_host,
            upstream_retry_after,
        },
        limits: Limits {
            max_header_bytes,
            max_body_bytes,
            header_read_timeout,
            tls_handshake_timeout,
            idle_timeout,
            body_read_timeout,
            http2_keep_alive_interval,
            http2_keep_alive_timeout,
        },
        login: LoginSettings {
            limiter: crate::auth::limiter::LimiterSettings {
                account_max_failures: account_max_failures.min(u64::from(u32::MAX)) as u32,
                account_address_max_failures: account_address_max_failures.min(u64::from(u32::MAX))
                    as u32,
                account_window,
                address_max_failures: address_max_failures.min(u64::from(u32::MAX)) as u32,
                address_window,
                capacity: limiter_capacity,
            },
            lockout_after: file.login.lockout_after.clamp(0, i64::from(u32::MAX)) as u32,
            max_concurrent_hashes,
        },
        api_browser: ApiBrowserSettings {
            enabled: file.api_browser.enabled,
            refresh: browser_refresh,
            fetch_timeout: browser_fetch_timeout,
        },
        password_policy: PasswordPolicy {
            min_length: password_min_length as usize,
            max_length: password_max_length as usize,
        },
        log: LogSettings {
            format,
            access_log: file.log.access_log,
        },
        routes,
    }
}

fn validate_jwt(jwt: &JwtSection, errors: &mut Vec<String>) -> JwtSettings {
    let access = jwt.token_expiration_time;
    let refresh = jwt.refresh_token_expiration_time;
    if access < 60 {
        errors.push(format!(
            "jwt.token_expiration_time (JWT_TOKEN_EXPIRATION_TIME): at least 60 seconds, got {access}"
        ));
    }
    if refresh < 900 {
        errors.push(format!(
            "jwt.refresh_token_expiration_time (JWT_REFRESH_TOKEN_EXPIRATION_TIME): at least 900 seconds, got {refresh}"
        ));
    }
    if access >= refresh {
        errors.push(format!(
            "jwt: the access token lifetime ({access} s) must be shorter than the refresh token lifetime ({refresh} s)"
        ));
    }
    if jwt.token_issuer.trim().is_empty() {
        errors.push("jwt.token_issuer (JWT_TOKEN_ISSUER): must not be empty".into());
    }
    let signing_key = match jwt.token_signing_key.trim() {
        "" => None,
        text => match base64::engine::general_purpose::STANDARD.decode(text) {
            Ok(bytes) if bytes.len() >= 64 => Some(bytes),
            Ok(bytes) => {
                errors.push(format!(
                    "jwt.token_signing_key (JWT_TOKEN_SIGNING_KEY): must decode to at least 512 bits, got {} bits",
                    bytes.len() * 8
                ));
                None
            }
            Err(_) => {
                errors
                    .push("jwt.token_signing_key (JWT_TOKEN_SIGNING_KEY): not valid Base64".into());
                None
            }
        },
    };
    JwtSettings {
        access_ttl: Duration::from_secs(access.max(0) as u64),
        refresh_ttl: Duration::from_secs(refresh.max(0) as u64),
        issuer: jwt.token_issuer.clone(),
        signing_key,
    }
}

fn validate_retention(section: &RetentionSection, errors: &mut Vec<String>) -> RetentionSettings {
    let mut duration = |name: &str, text: &str| match parse_duration(text) {
        Ok(d) => d,
        Err(e) => {
            errors.push(format!("retention.{name}: {e}"));
            Duration::ZERO
        }
    };
    let interval = match section.interval.trim() {
        "" => None,
        text => Some(duration("interval", text)).filter(|d| !d.is_zero()),
    };
    let sessions = duration("sessions", &section.sessions);
    let activation_tokens = duration("activation_tokens", &section.activation_tokens);
    let (batch, per_run) = (section.batch_size, section.max_rows_per_run);
    if !(1..=MAX_PRUNE_BATCH).contains(&batch) {
        errors.push(format!(
            "retention.batch_size: from 1 to {MAX_PRUNE_BATCH}, got {batch}"
        ));
    }
    if per_run < batch {
        errors.push(format!(
            "retention.max_rows_per_run: at least retention.batch_size ({batch}), got {per_run}"
        ));
    }
    RetentionSettings {
        interval,
        sessions,
        activation_tokens,
        batch_size: batch.clamp(1, MAX_PRUNE_BATCH) as u32,
        max_rows_per_run: per_run.max(1) as u64,
    }
}

fn validate_routes(
    routes: &[RouteSection],
    default_timeout: Duration,
    errors: &mut Vec<String>,
) -> Vec<RouteSpec> {
    if routes.is_empty() {
        errors.push("route: at least one [[route]] is required".into());
    }
    let mut specs = Vec::with_capacity(routes.len());
    for (i, route) in routes.iter().enumerate() {
        let here = format!("route[{i}]");
        if !route.prefix.starts_with('/') {
            errors.push(format!(
                "{here}.prefix: must start with '/', got {:?}",
                route.prefix
            ));
        }
        if route.prefix.contains(['?', '#', '%'])
            || route.prefix.contains("/../")
            || route.prefix.contains("/./")
        {
            errors.push(format!(
                "{here}.prefix: must be a plain, normalised path, got {:?}",
                route.prefix
            ));
        }
        if specs.iter().any(|s: &RouteSpec| s.prefix == route.prefix) {
            errors.push(format!(
                "{here}.prefix: {:?} is configured twice",
                route.prefix
            ));
        }
        if route.upstreams.is_empty() {
            errors.push(format!(
                "{here}.upstreams: at least one upstream is required"
            ));
        }
        let mut upstreams = Vec::new();
        for upstream in &route.upstreams {
            match parse_upstream(upstream) {
                Ok(uri) => upstreams.push(uri),
                Err(e) => errors.push(format!("{here}.upstreams: {upstream:?}: {e}")),
            }
        }
        let request_timeout = if route.request_timeout.trim().is_empty() {
            default_timeout
        } else {
            match parse_duration(&route.request_timeout) {
                Ok(d) if !d.is_zero() => d,
                Ok(_) => {
                    errors.push(format!("{here}.request_timeout: must be greater than zero"));
                    default_timeout
                }
                Err(e) => {
                    errors.push(format!("{here}.request_timeout: {e}"));
                    default_timeout
                }
            }
        };
        let name = if route.name.trim().is_empty() {
            route.prefix.clone()
        } else {
            route.name.clone()
        };
        // A path is resolved against the first upstream; when that one is
        // invalid it was reported above, and is not reported again here.
        let first_upstream = route
            .upstreams
            .first()
            .and_then(|text| parse_upstream(text).ok());
        let openapi = match route.openapi.trim() {
            "" => None,
            text if text.starts_with('/')
                && first_upstream.is_none()
                && !route.upstreams.is_empty() =>
            {
                None
            }
            text => match openapi_url(text, first_upstream.as_ref()) {
                Ok(uri) => Some(uri),
                Err(e) => {
                    errors.push(format!("{here}.openapi: {text:?}: {e}"));
                    None
                }
            },
        };
        specs.push(RouteSpec {
            openapi,
            name,
            prefix: route.prefix.clone(),
            upstreams,
            public: route.public,
            request_timeout,
        });
    }
    specs
}

/// `server.public_base_url`: empty, or an absolute http(s) URL without path,
/// query or fragment; kept without a trailing slash.
fn public_base_url(text: &str, errors: &mut Vec<String>) -> Option<String> {
    let text = text.trim().trim_end_matches('/');
    if text.is_empty() {
        return None;
    }
    match check_url(text, &PUBLIC_BASE_URL) {
        Ok(_) => Some(text.to_string()),
        Err(e) => {
            errors.push(format!("server.public_base_url: {text:?}: {e}"));
            None
        }
    }
}
fn optional_addr(name: &str, text: &str, errors: &mut Vec<String>) -> Option<SocketAddr> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    match text.parse() {
        Ok(addr) => Some(addr),
        Err(_) => {
            errors.push(format!(
                "{name}: {text:?} is not an address like 127.0.0.1:8443"
            ));
            None
        }
    }
}

fn parse_cidr(text: &str) -> Option<IpNet> {
    let text = text.trim();
    text.parse::<IpNet>()
        .ok()
        .or_else(|| text.parse::<std::net::IpAddr>().ok().map(IpNet::from))
}
