use std::io::Write;
use std::path::Path;
use std::time::Duration;

use base64::Engine;
use toml::Value;

use super::file::FileConfig;
use super::*;
use crate::vocab::identity::Authority;

fn load_text(text: &str, env: &[(&str, &str)]) -> Result<Settings, ConfigErrors> {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    load(&Source {
        file: Some(file.path()),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    })
}

#[test]
fn counts_use_the_singular_for_one_only() {
    assert_eq!(Count(0, "route", "routes").to_string(), "0 routes");
    assert_eq!(Count(1, "route", "routes").to_string(), "1 route");
    assert_eq!(Count(2, "route", "routes").to_string(), "2 routes");
    let one = ConfigErrors(vec!["listen.https: bad".into()]);
    assert!(
        one.to_string()
            .starts_with("invalid configuration (1 problem):\n"),
        "{one}"
    );
    let two = ConfigErrors(vec!["a: bad".into(), "b: bad".into()]);
    assert!(two.to_string().contains("(2 problems)"), "{two}");
    assert_eq!(two.one_line(), "a: bad; b: bad");
    let policy = PasswordPolicy {
        min_length: 1,
        max_length: 1,
    };
    assert_eq!(
        policy.check("").unwrap_err(),
        "Password must be at least 1 character long"
    );
    assert_eq!(
        policy.check("ab").unwrap_err(),
        "Password must be at most 1 character long"
    );
}

#[test]
fn built_in_defaults_are_valid() {
    let settings = load(&Source {
        file: None,
        env: vec![],
    })
    .unwrap();
    assert_eq!(
        settings.listen.https,
        Some("127.0.0.1:8443".parse().unwrap())
    );
    assert_eq!(settings.jwt.access_ttl, Duration::from_secs(9000));
    assert_eq!(settings.jwt.issuer, "thingsboard.io");
    assert_eq!(settings.routes.len(), 2);
}

#[test]
fn shipped_config_file_is_valid_and_matches_defaults() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/keygate.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let table: toml::Table = text.parse().unwrap();
    let defaults = Value::try_from(FileConfig::default()).unwrap();
    assert_eq!(
        Value::Table(table),
        defaults,
        "config/keygate.toml drifted from the defaults"
    );
    load(&Source {
        file: Some(&path),
        env: vec![],
    })
    .unwrap();
}

#[test]
fn every_problem_is_reported_at_once() {
    let errors = load_text(
        r#"
        bogus = 1
        [listen]
        https = "not-an-address"
        colour = "blue"
        [jwt]
        token_expiration_time = 30
        refresh_token_expiration_time = "long"
        [[route]]
        prefix = "api"
        upstreams = ["ftp://x"]
        "#,
        &[],
    )
    .unwrap_err();
    let text = errors.0.join("\n");
    for needle in [
        "bogus: unknown key",
        "listen.colour: unknown key",
        "listen.https",
        "jwt.refresh_token_expiration_time: expected integer",
        "at least 60 seconds",
        "route[0].prefix",
        "scheme \"ftp\"",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn environment_overrides_file_and_platform_names_apply() {
    let settings = load_text(
        "[listen]\nhttp = \"\"\n",
        &[
            ("KEYGATE_LISTEN_HTTPS", "0.0.0.0:443"),
            ("KEYGATE_PROXY_TRUSTED_PROXIES", "10.0.0.0/8, 192.168.1.1"),
            ("KEYGATE_API_KEYS_PREFIX", "kg_"),
            ("JWT_TOKEN_EXPIRATION_TIME", "120"),
            ("JWT_TOKEN_ISSUER", "example.org"),
            ("KEYGATE_JWT_TOKEN_ISSUER", "wins.example"),
            ("KEYGATE_CONFIG", "ignored"),
            ("PATH", "/usr/bin"),
        ],
    )
    .unwrap();
    assert_eq!(settings.listen.https, Some("0.0.0.0:443".parse().unwrap()));
    assert_eq!(settings.listen.http, None);
    assert_eq!(settings.proxy.trusted_proxies.len(), 2);
    assert_eq!(settings.api_key_prefix, "kg_");
    assert_eq!(settings.jwt.access_ttl, Duration::from_secs(120));
    assert_eq!(settings.jwt.issuer, "wins.example");
}

#[test]
fn the_scripts_own_variables_are_not_settings() {
    let settings = load_text(
        "",
        &[
            ("KEYGATE_BIN", "target/release/keygate"),
            ("KEYGATE_TEST_DATABASE_URL", "postgres://127.0.0.1/test"),
            ("KEYGATE_BOOTSTRAP_PASSWORD", "not-a-setting"),
        ],
    );
    assert!(settings.is_ok(), "{:?}", settings.err().map(|e| e.0));
}

#[test]
fn unknown_environment_setting_is_an_error() {
    let errors = load_text(
        "",
        &[("KEYGATE_LISTEN_HTTPZ", "x"), ("KEYGATE_CACHE_TTL", "soon")],
    )
    .unwrap_err();
    let text = errors.0.join("\n");
    assert!(
        text.contains("KEYGATE_LISTEN_HTTPZ: not a configuration setting"),
        "{text}"
    );
    assert!(text.contains("cache.ttl"), "{text}");
}

#[test]
fn jwt_lifetime_rules_are_checked() {
    let errors = load_text(
        "",
        &[
            ("JWT_TOKEN_EXPIRATION_TIME", "1000"),
            ("JWT_REFRESH_TOKEN_EXPIRATION_TIME", "900"),
        ],
    )
    .unwrap_err();
    assert!(
        errors.0.iter().any(|e| e.contains("must be shorter")),
        "{errors}"
    );
}

#[test]
fn short_signing_key_is_refused_with_a_clear_message() {
    let short = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
    let errors = load_text("", &[("JWT_TOKEN_SIGNING_KEY", &short)]).unwrap_err();
    assert!(
        errors.0[0].contains("at least 512 bits, got 256 bits"),
        "{errors}"
    );
    let long = base64::engine::general_purpose::STANDARD.encode([7u8; 64]);
    let settings = load_text("", &[("JWT_TOKEN_SIGNING_KEY", &long)]).unwrap();
    assert_eq!(settings.jwt.signing_key.as_deref(), Some(&[7u8; 64][..]));
    assert!(!format!("{:?}", settings.jwt).contains("7, 7"));
}

#[test]
fn password_policy_names_the_rule() {
    let policy = PasswordPolicy::default();
    assert!(policy.check("short").unwrap_err().contains("at least 8"));
    assert!(
        policy
            .check(&"x".repeat(73))
            .unwrap_err()
            .contains("at most 72")
    );
    policy.check("eightchr").unwrap();
    let errors = load_text(
        "[login]\npassword_min_length = 20\npassword_max_length = 10\n",
        &[],
    )
    .unwrap_err();
    assert!(
        errors.0.iter().any(|e| e.contains("must not exceed")),
        "{errors}"
    );
}

#[test]
fn connection_limits_have_documented_defaults_and_are_checked() {
    let settings = load_text("", &[]).unwrap();
    assert_eq!(settings.listen.max_connections_per_address, 256);
    assert_eq!(settings.listen.max_connections_per_trusted_proxy, None);
    assert_eq!(settings.listen.admin_max_connections, 64);
    assert_eq!(settings.limits.idle_timeout, Duration::from_secs(60));
    assert_eq!(settings.limits.body_read_timeout, Duration::from_secs(10));
    assert_eq!(
        settings.limits.http2_keep_alive_interval,
        Duration::from_secs(20)
    );
    assert_eq!(
        settings.limits.http2_keep_alive_timeout,
        Duration::from_secs(20)
    );
    let settings = load_text(
        "[listen]\nmax_connections_per_trusted_proxy = 2000\n",
        &[("KEYGATE_LIMITS_IDLE_TIMEOUT", "5s")],
    )
    .unwrap();
    assert_eq!(
        settings.listen.max_connections_per_trusted_proxy,
        Some(2000)
    );
    assert_eq!(settings.limits.idle_timeout, Duration::from_secs(5));
    let errors = load_text(
        "[listen]\nmax_connections_per_address = 0\nmax_connections_per_trusted_proxy = -1\n\
         [limits]\nidle_timeout = \"0s\"\nbody_read_timeout = \"soon\"\n",
        &[],
    )
    .unwrap_err();
    let text = errors.0.join("\n");
    for needle in [
        "listen.max_connections_per_address: must be a positive integer",
        "listen.max_connections_per_trusted_proxy: must not be negative",
        "limits.idle_timeout: must be greater than zero",
        "limits.body_read_timeout",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn buffered_body_bytes_defaults_to_64_kib_and_refuses_a_negative_size() {
    let settings = load_text("", &[]).unwrap();
    assert_eq!(settings.limits.buffered_body_bytes, 64 * 1024);
    let settings = load_text("", &[("KEYGATE_LIMITS_BUFFERED_BODY_BYTES", "0")]).unwrap();
    assert_eq!(
        settings.limits.buffered_body_bytes, 0,
        "0 turns buffering off"
    );
    let errors = load_text("[limits]\nbuffered_body_bytes = -1\n", &[]).unwrap_err();
    assert!(
        errors
            .0
            .iter()
            .any(|e| e.contains("limits.buffered_body_bytes: must be 0 or more")),
        "{errors}"
    );
}

#[test]
fn durations_parse_with_units() {
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
    assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
    assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(604_800)));
    assert!(parse_duration("30").is_err());
    assert!(parse_duration("s").is_err());
    assert!(parse_duration("3 weeks").is_err());
}

#[test]
fn retention_defaults_zero_interval_and_bounds() {
    let defaults = load_text("", &[]).unwrap().retention;
    assert_eq!(
        defaults,
        RetentionSettings {
            interval: Some(Duration::from_secs(3600)),
            sessions: Duration::from_secs(30 * 86_400),
            activation_tokens: Duration::from_secs(7 * 86_400),
            audit_events: Duration::from_secs(365 * 86_400),
            batch_size: 500,
            max_rows_per_run: 10_000,
        }
    );
    for off in ["0s", ""] {
        let settings = load_text("", &[("KEYGATE_RETENTION_INTERVAL", off)]).unwrap();
        assert_eq!(settings.retention.interval, None, "{off:?}");
    }
    let settings = load_text("[retention]\nsessions = \"0s\"\n", &[]).unwrap();
    assert_eq!(settings.retention.sessions, Duration::ZERO);
    let errors = load_text(
        "[retention]\nbatch_size = 0\nmax_rows_per_run = -1\nactivation_tokens = \"soon\"\n",
        &[],
    )
    .unwrap_err();
    let text = errors.0.join("\n");
    for needle in [
        "retention.batch_size: from 1 to 100000, got 0",
        "retention.max_rows_per_run: at least",
        "retention.activation_tokens",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn every_url_setting_is_checked_ports_included() {
    let errors = load_text(
        r#"
        [server]
        public_base_url = "https://keygate.example:0"
        [[route]]
        prefix = "/a/"
        upstreams = ["http://127.0.0.1:notaport", "http://127.0.0.1:99999", "http://127.0.0.1:"]
        openapi = "http://docs.example:65536/v3/api-docs"
        [[route]]
        prefix = "/b/"
        upstreams = ["http://user:secret@127.0.0.1:80", "http://:80", "http://bad host:80"]
        openapi = "/v3/api-docs"
        [[route]]
        prefix = "/c/"
        upstreams = ["http://[::1:80", "http://[::1]x", "http://127.0.0.1:80/base?x=1", "http://127.0.0.1:80/#top"]
        openapi = "docs.example/v3/api-docs"
        "#,
        &[],
    )
    .unwrap_err();
    let expected = [
        r#"server.public_base_url: "https://keygate.example:0": port "0" is not a number from 1 to 65535"#,
        r#"route[0].upstreams: "http://127.0.0.1:notaport": port "notaport" is not a number from 1 to 65535"#,
        r#"route[0].upstreams: "http://127.0.0.1:99999": port "99999" is not a number from 1 to 65535"#,
        r#"route[0].upstreams: "http://127.0.0.1:": port "" is not a number from 1 to 65535"#,
        r#"route[0].openapi: "http://docs.example:65536/v3/api-docs": port "65536" is not a number from 1 to 65535"#,
        r#"route[1].upstreams: "http://user:secret@127.0.0.1:80": must not contain a user name or password"#,
        r#"route[1].upstreams: "http://:80": missing host"#,
        r#"route[1].upstreams: "http://bad host:80": must not contain spaces"#,
        r#"route[2].upstreams: "http://[::1:80": "#,
        r#"route[2].upstreams: "http://[::1]x": "#,
        r#"route[2].upstreams: "http://127.0.0.1:80/base?x=1": must not have a query"#,
        r#"route[2].upstreams: "http://127.0.0.1:80/#top": must not have a fragment"#,
        r#"route[2].openapi: "docs.example/v3/api-docs": missing scheme"#,
    ];
    for wanted in expected {
        let found = errors.0.iter().filter(|p| p.starts_with(wanted)).count();
        assert_eq!(found, 1, "{wanted:?} once in:\n{errors}");
    }
    assert_eq!(
        errors.0.len(),
        expected.len(),
        "one message per problem, none for route[1].openapi (its upstream is already reported):\n{errors}"
    );

    let settings = load_text(
        r#"
        [server]
        public_base_url = "https://keygate.example:8443/"
        [[route]]
        prefix = "/a/"
        upstreams = ["http://127.0.0.1:65535", "http://[::1]:8080/base", "http://entity_service:80", "http://upstream.example"]
        openapi = "/v3/api-docs?group=public"
        "#,
        &[],
    )
    .unwrap();
    assert_eq!(
        settings.public_base_url.as_deref(),
        Some("https://keygate.example:8443")
    );
    assert_eq!(settings.routes[0].upstreams.len(), 4);
    assert_eq!(
        settings.routes[0].openapi.as_ref().map(ToString::to_string),
        Some("http://127.0.0.1:65535/v3/api-docs?group=public".into())
    );
}

#[test]
fn routes_without_a_name_are_labelled_by_prefix() {
    let settings = load_text(
        "[[route]]\nprefix = \"/api/\"\nupstreams = [\"http://127.0.0.1:1\", \"http://127.0.0.1:2/base\"]\nrequest_timeout = \"5s\"\n",
        &[],
    )
    .unwrap();
    assert_eq!(settings.routes[0].name, "/api/");
    assert_eq!(settings.routes[0].upstreams.len(), 2);
    assert_eq!(settings.routes[0].request_timeout, Duration::from_secs(5));
}

#[test]
fn upstream_url_is_split_into_scheme_authority_and_base_path() {
    let url: UpstreamUrl = " http://127.0.0.1:9000/base/ ".parse().unwrap();
    assert_eq!(url.scheme().as_str(), "http");
    assert_eq!(url.authority().as_str(), "127.0.0.1:9000");
    assert_eq!(url.base_path(), "/base");
    assert_eq!(url.to_string(), "http://127.0.0.1:9000/base");
    let url: UpstreamUrl = "http://[::1]:8080/".parse().unwrap();
    assert_eq!(url.base_path(), "");
    assert_eq!(url.to_string(), "http://[::1]:8080");
    let refused = "ftp://127.0.0.1:21".parse::<UpstreamUrl>().unwrap_err();
    assert!(refused.contains("scheme \"ftp\""), "{refused}");
    assert!("http://:80".parse::<UpstreamUrl>().is_err());
}

#[test]
fn limits_stay_local_and_quotas_off_by_default() {
    let settings = load(&Source {
        file: None,
        env: vec![],
    })
    .unwrap();
    assert!(settings.redis.is_none());
    assert_eq!(settings.quota.rates, [None, None, None]);
    assert_eq!(settings.quota.sync_interval, Duration::from_millis(100));
}

#[test]
fn redis_and_quotas_are_read_from_the_file_and_the_environment() {
    use super::rate::{Rate, RouteRate};
    let settings = load_text(
        r#"
        [redis]
        url = "redis://:secret@10.0.0.5:6380/2"
        [quota]
        per_key = "100/s"
        [[route]]
        prefix = "/api/"
        upstreams = ["http://127.0.0.1:9000"]
        quota = { per_key = "off", per_tenant = "50/m" }
        "#,
        &[("KEYGATE_QUOTA_PER_TENANT", "2000/m")],
    )
    .unwrap();
    let redis = settings.redis.as_ref().unwrap();
    assert_eq!(redis.command_timeout, Duration::from_millis(100));
    assert_eq!(redis.key_prefix, "keygate:");
    assert!(
        !format!("{settings:?}").contains("secret"),
        "the password never reaches Debug"
    );
    assert_eq!(settings.quota.rates[0], Some(Rate::parse("100/s").unwrap()));
    assert_eq!(
        settings.quota.rates[2],
        Some(Rate::parse("2000/m").unwrap())
    );
    let route = &settings.routes[0].quota.0;
    assert_eq!(route[0], RouteRate::Off);
    assert_eq!(route[1], RouteRate::Inherit);
    assert_eq!(route[2], RouteRate::Own(Rate::parse("50/m").unwrap()));
}

#[test]
fn bad_redis_and_quota_settings_are_reported_without_the_password() {
    let errors = load_text(
        r#"
        [redis]
        url = "rediss://:hunter2@cache:6380"
        command_timeout = "0s"
        key_prefix = "has space"
        [quota]
        per_key = "100"
        per_user = "5/w"
        sync_interval = "1ms"
        [[route]]
        prefix = "/api/"
        upstreams = ["http://127.0.0.1:9000"]
        quota = { per_tenant = "none" }
        "#,
        &[],
    )
    .unwrap_err();
    let text = errors.0.join("\n");
    for needle in [
        "redis.command_timeout: must be greater than zero",
        "redis.key_prefix:",
        "quota.per_key: \"100\" is not a rate",
        "quota.per_user: \"5/w\": unknown unit",
        "quota.sync_interval: from 10ms to 10s",
        "route[0].quota.per_tenant:",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert!(!text.contains("hunter2"), "{text}");
}

/// A CA certificate of the test's own, as a PEM file in `dir`.
fn redis_ca(dir: &Path) -> std::path::PathBuf {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let path = dir.join("redis-ca.pem");
    std::fs::write(&path, params.self_signed(&key).unwrap().pem()).unwrap();
    path
}

#[test]
fn rediss_urls_are_accepted_with_a_ca_file_from_the_file_or_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let ca = redis_ca(dir.path());
    let settings = load_text(
        r#"
        [redis]
        url = "rediss://:secret@cache.example:6380/1"
        "#,
        &[("KEYGATE_REDIS_CA_FILE", ca.to_str().unwrap())],
    )
    .unwrap();
    let redis = settings.redis.as_ref().unwrap();
    assert_eq!(redis.ca_file.as_deref(), Some(ca.as_path()));
    let tls = redis.tls().expect("rediss:// speaks TLS");
    assert_eq!(tls.ca_file.as_deref(), Some(ca.as_path()));
    assert!(!format!("{settings:?}").contains("secret"));

    // Without a CA file the system's roots alone are trusted.
    let settings = load_text("[redis]\nurl = \"rediss://cache.example\"\n", &[]).unwrap();
    let redis = settings.redis.unwrap();
    assert_eq!(redis.ca_file, None);
    assert_eq!(redis.tls().unwrap().ca_file, None);

    let settings = load_text("[redis]\nurl = \"redis://cache.example\"\n", &[]).unwrap();
    assert!(settings.redis.unwrap().tls().is_none(), "redis:// is plain");
}

#[test]
fn a_redis_ca_file_beside_a_plain_url_names_both_settings() {
    let dir = tempfile::tempdir().unwrap();
    let ca = redis_ca(dir.path());
    for url in ["redis://:hunter2@cache:6379", ""] {
        let errors = load_text(
            &format!(
                "[redis]\nurl = {url:?}\nca_file = {:?}\n",
                ca.display().to_string()
            ),
            &[],
        )
        .unwrap_err();
        let text = errors.0.join("\n");
        assert!(
            text.contains("redis.ca_file:") && text.contains("redis.url is not a rediss:// URL"),
            "{text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
    }
}

#[test]
fn a_redis_ca_file_that_holds_no_certificate_is_named_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    for (file, reason) in [(&missing, "No such file"), (&junk, "no PEM certificate")] {
        let errors = load_text(
            &format!(
                "[redis]\nurl = \"rediss://:hunter2@cache:6380\"\nca_file = {:?}\n",
                file.display().to_string()
            ),
            &[],
        )
        .unwrap_err();
        let text = errors.0.join("\n");
        let named = format!("redis.ca_file: {}", file.display());
        assert!(text.contains(&named) && text.contains(reason), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
    }
}

#[test]
fn redis_urls_other_than_redis_and_rediss_are_refused_and_verification_stays_on() {
    for (url, expected) in [
        (
            "http://:hunter2@cache:6379",
            "redis.url: must start with redis:// or rediss:// (TLS), got scheme \"http\"",
        ),
        (
            "rediss://:hunter2@cache:6380/#insecure",
            "redis.url: must not have a fragment (#...): a rediss:// server's certificate is always verified",
        ),
        (
            "rediss://:hunter2@/0",
            "redis.url: not a valid rediss://[:password@]host[:port][/db] URL",
        ),
    ] {
        let errors = load_text(&format!("[redis]\nurl = {url:?}\n"), &[]).unwrap_err();
        let text = errors.0.join("\n");
        assert!(text.contains(expected), "{url}: {text}");
        assert!(!text.contains("hunter2"), "{text}");
    }
}

/// Hostile configuration files and environments, for the property tests and
/// `fuzz/run`: every one loads or is refused with messages, never a panic.
mod properties {
    use super::*;
    use proptest::prelude::*;

    /// Every `section.key` of the defaults, so values land where they are read.
    fn keys() -> Vec<(String, String)> {
        let defaults = Value::try_from(FileConfig::default()).unwrap();
        let mut keys = Vec::new();
        for (section, table) in defaults.as_table().unwrap() {
            match table.as_table() {
                Some(table) => keys.extend(table.keys().map(|k| (section.clone(), k.clone()))),
                None => keys.push((String::new(), section.clone())),
            }
        }
        keys
    }

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            any::<bool>().prop_map(|b| b.to_string()),
            "[0-9]{0,4}(ms|s|m|h|d|x)?".prop_map(|s| format!("{s:?}")),
            "[a-z0-9:/.\\[\\]@%-]{0,24}".prop_map(|s| format!("{s:?}")),
            any::<String>().prop_map(|s| format!("{s:?}")),
            Just("[]".to_string()),
            Just("[\"\", 1]".to_string()),
            Just("{ a = 1 }".to_string()),
        ]
    }

    fn file() -> impl Strategy<Value = String> {
        let keys = keys();
        proptest::collection::vec((0..keys.len(), value()), 0..6).prop_map(move |entries| {
            let mut text = String::new();
            for (index, value) in entries {
                let (section, key) = &keys[index];
                if section.is_empty() {
                    text.push_str(&format!("{key} = {value}\n"));
                } else {
                    text.push_str(&format!("[{section}]\n{key} = {value}\n"));
                }
            }
            text
        })
    }

    proptest! {
        #[test]
        fn any_config_loads_or_is_refused_with_reasons(text in file()) {
            if let Err(errors) = load_text(&text, &[]) {
                prop_assert!(!errors.0.is_empty());
                prop_assert!(errors.0.iter().all(|e| !e.trim().is_empty()));
            }
        }

        #[test]
        fn any_environment_override_loads_or_is_refused(
            key in proptest::sample::select(keys()),
            value in any::<String>(),
        ) {
            let (section, key) = key;
            let name = format!("KEYGATE_{}_{}", section, key).to_uppercase();
            if let Err(errors) = load_text("", &[(&name, &value)]) {
                prop_assert!(!errors.0.is_empty());
            }
        }

        #[test]
        fn durations_parse_exactly_or_are_refused(text in any::<String>(), n in 0u64..1_000_000) {
            let _ = parse_duration(&text);
            prop_assert_eq!(parse_duration(&format!("{n}s")), Ok(Duration::from_secs(n)));
            prop_assert_eq!(parse_duration(&format!("{n}ms")), Ok(Duration::from_millis(n)));
        }
    }
}

#[test]
fn websocket_settings_have_the_platforms_defaults_and_are_checked() {
    let settings = load_text("", &[]).unwrap().websocket;
    assert_eq!(settings.routes, ["/api/ws", "/api/ws/plugins/"]);
    assert_eq!(settings.auth_timeout, Duration::from_secs(10));
    assert_eq!(settings.max_message_bytes, 32 * 1024);
    assert_eq!(
        (settings.max_per_user, settings.max_per_tenant),
        (None, None)
    );
    let settings = load_text(
        "[websocket]\nmax_per_user = 5\n",
        &[("KEYGATE_WEBSOCKET_ROUTES", "/ws,/live/")],
    )
    .unwrap()
    .websocket;
    assert_eq!(settings.routes, ["/ws", "/live/"]);
    assert_eq!(settings.max_per_user, Some(5));
    let errors = load_text(
        "[websocket]\nroutes = [\"api/ws\", \"/api/../ws\"]\nauth_timeout = \"0s\"\n\
         max_message_bytes = 0\nmax_per_tenant = -1\n",
        &[],
    )
    .unwrap_err();
    let text = errors.0.join("\n");
    for needle in [
        "websocket.routes: \"api/ws\" is not a normalised absolute path",
        "websocket.routes: \"/api/../ws\" is not a normalised absolute path",
        "websocket.auth_timeout: must be greater than zero",
        "websocket.max_message_bytes: must be a positive integer",
        "websocket.max_per_tenant: must not be negative",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn workers_default_to_one_per_core_and_a_wild_count_is_refused() {
    let settings = load_text("", &[]).unwrap();
    assert_eq!(settings.workers, 0, "0: one per core");
    let settings = load_text("", &[("KEYGATE_SERVER_WORKERS", "3")]).unwrap();
    assert_eq!(settings.workers, 3);
    for bad in ["-1", "100000"] {
        let errors = load_text(&format!("[server]\nworkers = {bad}\n"), &[]).unwrap_err();
        let text = errors.0.join("\n");
        assert!(
            text.contains("server.workers: must be 0 (one per core) to 1024"),
            "{bad}: {text}"
        );
    }
}

#[test]
fn the_ipv6_prefix_length_defaults_to_64_and_is_checked() {
    let defaults = load_text("", &[]).unwrap();
    assert_eq!(defaults.limits.ipv6_prefix_len, 64);
    let set = load_text("[limits]\nipv6_prefix_len = 48\n", &[]).unwrap();
    assert_eq!(set.limits.ipv6_prefix_len, 48);
    for bad in ["0", "129", "-1"] {
        let errors = load_text(&format!("[limits]\nipv6_prefix_len = {bad}\n"), &[]).unwrap_err();
        assert_eq!(
            errors.0,
            vec![format!(
                "limits.ipv6_prefix_len: must be from 1 to 128, got {bad}"
            )]
        );
    }
}

/// A `[platform]` section and a route that needs it.
fn platform_config(key: &str) -> String {
    format!(
        "[platform]\nsigning_key = \"{key}\"\n[[route]]\nname = \"tb\"\nprefix = \"/tb/\"\nupstreams = [\"http://127.0.0.1:9000\"]\nidentity = \"platform\"\n"
    )
}

#[test]
fn the_platform_key_is_read_as_the_platform_decodes_it() {
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = b64.encode([9u8; 64]);
    let settings = load_text(&platform_config(&key), &[]).unwrap();
    assert_eq!(
        settings.platform.signing_key.as_deref(),
        Some(&[9u8; 64][..])
    );
    assert_eq!(settings.platform.issuer, "thingsboard.io");
    assert_eq!(settings.platform.token_lifetime, Duration::from_secs(300));
    // Padding is optional to the platform's decoder, so it is here.
    let unpadded = b64.encode([9u8; 65]);
    let unpadded = unpadded.trim_end_matches('=');
    let settings = load_text(&platform_config(unpadded), &[]).unwrap();
    assert_eq!(settings.platform.signing_key.map(|k| k.len()), Some(65));
    // The environment names it too, and nothing prints it.
    let settings = load_text(
        "[[route]]\nname = \"tb\"\nprefix = \"/tb/\"\nupstreams = [\"http://127.0.0.1:9000\"]\nidentity = \"platform\"\n",
        &[("KEYGATE_PLATFORM_SIGNING_KEY", &key)],
    )
    .unwrap();
    assert!(settings.platform.signing_key.is_some());
    let printed = format!("{settings:?}");
    assert!(
        !printed.contains("9, 9") && !printed.contains(&key),
        "{printed}"
    );
}

#[test]
fn a_short_or_garbled_platform_key_is_refused_with_a_clear_message() {
    let short = base64::engine::general_purpose::STANDARD.encode([9u8; 32]);
    let errors = load_text(&platform_config(&short), &[]).unwrap_err();
    assert!(
        errors
            .0
            .iter()
            .any(|e| e.contains("platform.signing_key")
                && e.contains("at least 512 bits, got 256 bits")),
        "{errors}"
    );
    let errors = load_text(&platform_config("not base64!"), &[]).unwrap_err();
    assert!(
        errors
            .0
            .iter()
            .any(|e| e.contains("platform.signing_key") && e.contains("Base64")),
        "{errors}"
    );
}

#[test]
fn a_platform_route_without_a_configured_key_loads_for_the_store_to_supply_it() {
    // The key may have been imported into the store, which only the start
    // can read: it refuses there when neither has one.
    let settings = load_text(&platform_config(""), &[]).unwrap();
    assert_eq!(settings.platform.signing_key, None);
}

#[test]
fn the_platform_key_may_not_be_keygates_own() {
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = b64.encode([9u8; 64]);
    let errors = load_text(&platform_config(&key), &[("JWT_TOKEN_SIGNING_KEY", &key)]).unwrap_err();
    assert!(
        errors
            .0
            .iter()
            .any(|e| e.contains("must differ from jwt.token_signing_key")),
        "{errors}"
    );
    // The same bytes written another way are the same key.
    let unpadded = b64.encode([9u8; 65]);
    let errors = load_text(
        &platform_config(unpadded.trim_end_matches('=')),
        &[("JWT_TOKEN_SIGNING_KEY", &unpadded)],
    )
    .unwrap_err();
    assert!(
        errors.0.iter().any(|e| e.contains("must differ")),
        "{errors}"
    );
}

#[test]
fn a_platform_token_lifetime_under_a_second_is_refused() {
    let key = base64::engine::general_purpose::STANDARD.encode([9u8; 64]);
    let text = platform_config(&key).replacen(
        "[platform]\n",
        "[platform]\ntoken_lifetime = \"500ms\"\n",
        1,
    );
    let errors = load_text(&text, &[]).unwrap_err();
    assert!(
        errors
            .0
            .iter()
            .any(|e| e.contains("platform.token_lifetime: at least 1s")),
        "{errors}"
    );
}

#[test]
fn assertion_settings_have_documented_defaults_and_are_checked() {
    let settings = load_text("", &[]).unwrap().assertion;
    assert_eq!(settings.issuer, "keygate");
    assert_eq!(settings.lifetime, Duration::from_secs(300));
    assert_eq!(settings.algorithm, AssertionAlgorithm::Es256);
    assert_eq!(settings.signing_key_file, None);
    assert_eq!(settings.jwks_max_age, Duration::from_secs(300));
    assert!(settings.reuse, "assertions are reused by default");
    let settings = load_text(
        "[server]\npublic_base_url = \"https://gw.example/\"\n",
        &[
            ("KEYGATE_ASSERTION_ALGORITHM", "EdDSA"),
            ("KEYGATE_ASSERTION_REUSE", "false"),
        ],
    )
    .unwrap()
    .assertion;
    assert_eq!(settings.issuer, "https://gw.example", "the public base URL");
    assert_eq!(settings.algorithm, AssertionAlgorithm::EdDsa);
    assert!(!settings.reuse);
    let settings = load_text("[assertion]\nissuer = \"edge\"\n", &[])
        .unwrap()
        .assertion;
    assert_eq!(settings.issuer, "edge");
    let errors = load_text(
        "[assertion]\nlifetime = \"5s\"\nalgorithm = \"HS256\"\n\
         signing_key_file = \"/nonexistent/key.pem\"\njwks_max_age = \"2d\"\n",
        &[],
    )
    .unwrap_err();
    let text = errors.0.join("\n");
    for needle in [
        "assertion.lifetime: must be from 10s to 1h, got \"5s\"",
        "assertion.algorithm: must be \"ES256\" or \"EdDSA\", got \"HS256\"",
        "assertion.signing_key_file: file \"/nonexistent/key.pem\" does not exist",
        "assertion.jwks_max_age: must be at most 1d, got \"2d\"",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    let errors = load_text("[assertion]\nlifetime = \"2h\"\n", &[]).unwrap_err();
    assert!(
        errors.0.join("\n").contains("assertion.lifetime"),
        "{errors}"
    );
}

fn written(text: &str, env: &[(&str, &str)]) -> Written {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    load_written(&Source {
        file: Some(file.path()),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    })
    .unwrap()
    .1
}

#[test]
fn a_reload_names_each_changed_setting_it_cannot_apply() {
    let route = "[[route]]\nprefix = \"/api/\"\nupstreams = [\"http://127.0.0.1:9\"]\n";
    let running = written(route, &[]);
    assert!(needs_restart(&running, &written(route, &[])).is_empty());
    let other_route = "[[route]]\nprefix = \"/v2/\"\nupstreams = [\"http://127.0.0.1:8\"]\n";
    assert!(
        needs_restart(&running, &written(other_route, &[])).is_empty(),
        "routes reload"
    );
    let changed = written(
        &format!("[quota]\nper_key = \"10/s\"\n[cache]\nttl = \"5s\"\n{route}"),
        &[("KEYGATE_LIMITS_MAX_BODY_BYTES", "1000")],
    );
    assert_eq!(
        needs_restart(&running, &changed),
        ["cache.ttl", "limits.max_body_bytes", "quota.per_key"]
    );
}

#[test]
fn public_customers_are_read_with_their_tenants_and_checked() {
    let (customer, tenant) = (uuid::Uuid::from_u128(7), uuid::Uuid::from_u128(8));
    let text = format!(
        "[platform]\npublic_customers = [{{ customer_id = \"{customer}\", tenant_id = \"{tenant}\" }}]\n"
    );
    let settings = load_text(&text, &[]).unwrap();
    assert_eq!(
        settings.platform.public_customers,
        [crate::vocab::settings::PublicCustomer {
            customer_id: customer,
            tenant_id: tenant
        }]
    );
    assert!(
        load_text("", &[])
            .unwrap()
            .platform
            .public_customers
            .is_empty()
    );
    let null = crate::vocab::identity::NULL_UUID;
    let bad = format!(
        "[platform]\npublic_customers = [\n  {{ customer_id = \"nope\", tenant_id = \"{tenant}\" }},\n  {{ customer_id = \"{customer}\", tenant_id = \"{null}\" }},\n  {{ customer_id = \"{customer}\", tenant_id = \"{tenant}\" }},\n  {{ customer_id = \"{customer}\", tenant_id = \"{tenant}\" }},\n  {{ customer_id = \"{customer}\" }},\n]\n"
    );
    let errors = load_text(&bad, &[]).unwrap_err().0;
    let has = |part: &str| errors.iter().any(|e| e.contains(part));
    assert!(
        has("platform.public_customers[0].customer_id: must be a UUID"),
        "{errors:?}"
    );
    assert!(
        has("platform.public_customers[1].tenant_id: must be a UUID other than the null id"),
        "{errors:?}"
    );
    assert!(
        has("platform.public_customers[3].customer_id") && has("listed twice"),
        "{errors:?}"
    );
    assert!(
        has("platform.public_customers[4].tenant_id: must be a UUID"),
        "{errors:?}"
    );
    let shapes = format!(
        "[platform]\npublic_customers = [{{ customer_id = \"{customer}\", tenant = \"{tenant}\" }}, \"{customer}\"]\n"
    );
    let errors = load_text(&shapes, &[]).unwrap_err().0;
    let has = |part: &str| errors.iter().any(|e| e.contains(part));
    assert!(
        has("platform.public_customers[0].tenant: unknown key"),
        "{errors:?}"
    );
    assert!(
        has("platform.public_customers[1]: expected table, got string"),
        "{errors:?}"
    );
}

#[test]
fn two_factor_enforcement_names_whom_and_refuses_what_cannot_be_enforced() {
    let settings = load_text("", &[]).unwrap();
    assert_eq!(settings.two_factor.enforced, None);
    let tenant = "784f394c-42b6-435a-983c-b7beff2784f9";
    let settings = load_text(
        &format!(
            "[two_factor]\nenforce = true\nenforced_users = \"TENANT_ADMINISTRATORS\"\nenforced_tenants = [\"{tenant}\"]\n"
        ),
        &[],
    )
    .unwrap();
    assert_eq!(
        settings.two_factor.enforced,
        Some(EnforcedUsers::TenantAdministrators {
            tenants_ids: Some(vec![uuid::Uuid::parse_str(tenant).unwrap()]),
            tenant_profiles_ids: None,
        })
    );
    let errors = load_text(
        "[two_factor]\nenforce = true\nenforced_users = \"CUSTOMERS\"\nenforced_tenants = [\"x\"]\nproviders = [\"BACKUP_CODE\"]\n",
        &[],
    )
    .unwrap_err();
    let text = errors.to_string();
    assert!(
        text.contains("two_factor.enforced_users: \"CUSTOMERS\""),
        "{text}"
    );
    assert!(
        text.contains("two_factor.enforced_tenants: \"x\" is not a tenant id"),
        "{text}"
    );
    assert!(
        text.contains("two_factor.enforce: needs a provider other than BACKUP_CODE"),
        "{text}"
    );
}

#[test]
fn mail_is_off_by_default_and_its_settings_are_read_and_checked() {
    let defaults = load_text("", &[]).unwrap();
    assert!(defaults.mail.is_none());
    assert_eq!(defaults.two_factor.providers, ["TOTP", "BACKUP_CODE"]);

    let settings = load_text(
        "[mail]\nhost = \"smtp.example.com\"\nusername = \"keygate\"\nfrom = \"keygate <noreply@example.com>\"\n",
        &[("KEYGATE_MAIL_PASSWORD", "s3cret-mail-password")],
    )
    .unwrap();
    let mail = settings.mail.unwrap();
    assert_eq!((mail.port, mail.tls), (587, MailTls::StartTls));
    assert_eq!(
        mail.credentials,
        Some(("keygate".into(), "s3cret-mail-password".into()))
    );
    assert_eq!(mail.reset_link_lifetime, Duration::from_secs(3600));
    assert_eq!(mail.code_lifetime, Duration::from_secs(120));
    assert!(!format!("{mail:?}").contains("s3cret"), "never shown");
    // Mail configured: the default providers gain EMAIL.
    assert_eq!(
        settings.two_factor.providers,
        ["TOTP", "BACKUP_CODE", "EMAIL"]
    );
    let explicit = load_text(
        "[mail]\nhost = \"smtp.example.com\"\nfrom = \"a@example.com\"\n[two_factor]\nproviders = [\"TOTP\"]\n",
        &[],
    )
    .unwrap();
    assert_eq!(explicit.two_factor.providers, ["TOTP"]);
}

#[test]
fn mail_without_tls_is_refused_unless_the_server_is_on_loopback() {
    let errors = load_text(
        "[mail]\nhost = \"smtp.example.com\"\ntls = \"none\"\nfrom = \"a@example.com\"\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(errors.contains("mail.tls: \"none\""), "{errors}");
    for host in ["127.0.0.1", "localhost", "::1"] {
        let text = format!("[mail]\nhost = \"{host}\"\ntls = \"none\"\nfrom = \"a@example.com\"\n");
        let mail = load_text(&text, &[]).unwrap().mail.unwrap();
        assert_eq!((mail.tls, mail.port), (MailTls::None, 25), "{host}");
    }
    let errors = load_text(
        "[mail]\nhost = \"127.0.0.1\"\ntls = \"none\"\nusername = \"u\"\nfrom = \"a@example.com\"\n",
        &[("KEYGATE_MAIL_PASSWORD", "pw")],
    )
    .unwrap_err()
    .to_string();
    assert!(errors.contains("never sent without TLS"), "{errors}");
    assert!(!errors.contains("pw\""), "{errors}");
}

#[test]
fn bad_mail_settings_are_all_reported() {
    let errors = load_text(
        "[mail]\nhost = \"smtp.example.com\"\ntls = \"ssl\"\nfrom = \"not an address\"\nqueue_size = 0\nusername = \"u\"\ncode_lifetime = \"5s\"\nactivation_template = \"/nonexistent/template.txt\"\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    for expected in [
        "mail.tls:",
        "mail.from:",
        "mail.queue_size:",
        "mail.password: required",
        "mail.code_lifetime:",
        "mail.activation_template: cannot read",
    ] {
        assert!(errors.contains(expected), "{expected} in {errors}");
    }
    let errors = load_text("[two_factor]\nproviders = [\"TOTP\", \"EMAIL\"]\n", &[])
        .unwrap_err()
        .to_string();
    assert!(errors.contains("EMAIL needs mail"), "{errors}");
}

#[test]
fn a_mail_template_file_gives_the_subject_and_body() {
    let mut template = tempfile::NamedTempFile::new().unwrap();
    template
        .write_all(b"Subject: Reset for ${targetEmail}\n\nGo to ${passwordResetLink}\n")
        .unwrap();
    let text = format!(
        "[mail]\nhost = \"127.0.0.1\"\ntls = \"none\"\nfrom = \"a@example.com\"\nreset_template = \"{}\"\n",
        template.path().display()
    );
    let mail = load_text(&text, &[]).unwrap().mail.unwrap();
    assert_eq!(
        mail.reset_template,
        Some(MailTemplate {
            subject: "Reset for ${targetEmail}".into(),
            body: "Go to ${passwordResetLink}\n".into(),
        })
    );
    let mut bad = tempfile::NamedTempFile::new().unwrap();
    bad.write_all(b"no subject line\n\nbody").unwrap();
    let text = format!(
        "[mail]\nhost = \"127.0.0.1\"\ntls = \"none\"\nfrom = \"a@example.com\"\ncode_template = \"{}\"\n",
        bad.path().display()
    );
    let errors = load_text(&text, &[]).unwrap_err().to_string();
    assert!(
        errors.contains("must start with a \"Subject: ...\" line"),
        "{errors}"
    );
}

#[test]
fn the_sync_is_off_by_default_and_reads_its_url_from_the_environment() {
    let settings = load_text("", &[]).unwrap();
    assert!(settings.platform.sync.is_none());
    let url = "postgres://reader:secret-pw@platform-db:5432/thingsboard";
    let text = format!(
        "{}[platform]\nupstream = \"tb\"\n",
        platform_config("").replace("[platform]\nsigning_key = \"\"\n", "")
    );
    let settings = load_text(&text, &[("KEYGATE_PLATFORM_DATABASE_URL", url)]).unwrap();
    let sync = settings.platform.sync.as_ref().unwrap();
    assert_eq!(sync.database_url, url);
    assert_eq!(sync.interval, Duration::from_secs(10));
    assert_eq!(sync.upstream, "tb");
    let printed = format!("{settings:?}");
    assert!(!printed.contains("secret-pw"), "{printed}");
}

#[test]
fn the_sync_upstream_must_name_a_platform_route_and_the_url_be_postgres() {
    let routes =
        "[[route]]\nname = \"api\"\nprefix = \"/api/\"\nupstreams = [\"http://127.0.0.1:9000\"]\n";
    let errors = load_text(
        &format!("[platform]\ndatabase_url = \"mysql://db/tb\"\nupstream = \"api\"\nsync_interval = \"0s\"\n{routes}"),
        &[],
    )
    .unwrap_err();
    for expected in [
        "platform.upstream: the route \"api\" must have identity = \"platform\"",
        "platform.database_url (KEYGATE_PLATFORM_DATABASE_URL): must be a postgres:// URL",
        "platform.sync_interval: must be greater than zero",
    ] {
        assert!(errors.0.iter().any(|e| e.contains(expected)), "{errors}");
    }
    let errors = load_text(
        &format!("[platform]\nupstream = \"nowhere\"\n{routes}"),
        &[],
    )
    .unwrap_err();
    assert!(
        errors
            .0
            .iter()
            .any(|e| e.contains("platform.upstream: no [[route]] is named \"nowhere\"")),
        "{errors}"
    );
}

#[test]
fn two_assertion_routes_with_one_name_or_one_audience_are_refused_naming_both() {
    let route = |name: &str, prefix: &str, identity: &str, audience: &str, port: u16| {
        format!(
            "[[route]]\nname = \"{name}\"\nprefix = \"{prefix}\"\nupstreams = [\"http://127.0.0.1:{port}\"]\n\
             identity = \"{identity}\"\naudience = \"{audience}\"\n"
        )
    };
    // One name: both assertions would carry the same audience.
    let text = route("billing", "/api/a/", "assertion", "", 9001)
        + &route("billing", "/api/b/", "assertion", "", 9002);
    let errors = load_text(&text, &[]).unwrap_err().0;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("route[1].name: \"billing\" is also the name of route[0]")
            && errors[0].contains("\"/api/a/\"")
            && errors[0].contains("\"/api/b/\""),
        "{errors:?}"
    );
    // One audience, set on one and taken from the name on the other, for
    // another upstream.
    let text = route("billing", "/api/a/", "assertion", "", 9001)
        + &route("ledger", "/api/b/", "headers", "billing", 9002)
        + &route("reports", "/api/c/", "assertion", "billing", 9003);
    let errors = load_text(&text, &[]).unwrap_err().0;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("route[2].audience: \"billing\" is also the audience of route[0]")
            && errors[0].contains("\"/api/a/\"")
            && errors[0].contains("\"/api/c/\""),
        "{errors:?}"
    );
    // Distinct ones load; a headers route may share anything (it issues
    // none); one audience on routes to the same upstream is one recipient.
    let text = route("billing", "/api/a/", "assertion", "", 9001)
        + &route("billing", "/api/b/", "headers", "", 9002)
        + &route("reports", "/api/c/", "assertion", "reports-v2", 9003)
        + &route("reports-ws", "/api/ws", "assertion", "reports-v2", 9003);
    let settings = load_text(&text, &[]).unwrap();
    assert_eq!(settings.routes.len(), 4);
}

#[test]
fn store_migrate_is_auto_unless_set_to_never_in_the_file_or_the_environment() {
    let settings = load_text("", &[]).unwrap();
    assert_eq!(settings.store_migrate, StoreMigrate::Auto);
    let settings = load_text("[store]\nmigrate = \"never\"\n", &[]).unwrap();
    assert_eq!(settings.store_migrate, StoreMigrate::Never);
    let settings = load_text(
        "[store]\nmigrate = \"auto\"\n",
        &[("KEYGATE_STORE_MIGRATE", "never")],
    )
    .unwrap();
    assert_eq!(settings.store_migrate, StoreMigrate::Never);
    let errors = load_text("[store]\nmigrate = \"sometimes\"\n", &[]).unwrap_err();
    assert!(
        errors
            .0
            .iter()
            .any(|e| e.starts_with("store.migrate:") && e.contains("sometimes")),
        "{errors}"
    );
}

#[test]
fn a_transaction_pooler_needs_postgres_and_a_notify_url_is_checked_without_being_shown() {
    let settings = load_text("", &[]).unwrap();
    assert_eq!(settings.store_pooler, Pooler::None);
    assert_eq!(settings.store_notify_url, None);
    let settings = load_text(
        "[store]\nurl = \"postgres://kg@pgbouncer:6432/keygate\"\n",
        &[
            ("KEYGATE_STORE_POOLER", "transaction"),
            (
                "KEYGATE_STORE_NOTIFY_URL",
                "postgres://kg:secret-pw@db:5432/keygate",
            ),
        ],
    )
    .unwrap();
    assert_eq!(settings.store_pooler, Pooler::Transaction);
    assert_eq!(
        settings.store_notify_url.as_deref(),
        Some("postgres://kg:secret-pw@db:5432/keygate")
    );
    let errors = load_text(
        "[store]\npooler = \"statement\"\nnotify_url = \"mysql://kg:secret-pw@db/keygate\"\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        errors.contains("store.pooler: \"none\" or \"transaction\", got \"statement\""),
        "{errors}"
    );
    assert!(
        errors.contains("store.notify_url: must start with postgres://"),
        "{errors}"
    );
    assert!(!errors.contains("secret-pw"), "{errors}");
    let errors = load_text(
        "[store]\npooler = \"transaction\"\nnotify_url = \"postgres://kg@db/keygate\"\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        errors.contains("store.pooler: \"transaction\" needs a postgres:// store.url"),
        "{errors}"
    );
    assert!(
        errors.contains("store.notify_url: only with a postgres:// store.url"),
        "{errors}"
    );
    let errors = load_text(
        "[store]\nurl = \"postgres://kg@pgbouncer/keygate\"\npooler = \"transaction\"\n\
         [platform]\ndatabase_url = \"postgres://tb@platform/thingsboard\"\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        errors.contains("store.notify_url: the platform sync"),
        "{errors}"
    );
}

#[test]
fn https_upstreams_default_to_port_443_and_get_tls_built_from_upstream_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    let certified = rcgen::generate_simple_self_signed(vec!["api.example".into()]).unwrap();
    std::fs::write(&ca, certified.cert.pem()).unwrap();
    let settings = load_text(
        &format!(
            r#"
            [[route]]
            prefix = "/api/"
            upstreams = ["https://api.example/base", "https://127.0.0.1:8443", "http://127.0.0.1:9000"]
            upstream_tls = {{ ca_file = "{}" }}
            [[route]]
            prefix = "/plain/"
            upstreams = ["http://127.0.0.1:9000"]
            "#,
            ca.display()
        ),
        &[],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let route = &settings.routes[0];
    let ports: Vec<u16> = route.upstreams.iter().map(UpstreamUrl::port).collect();
    assert_eq!(ports, vec![443, 8443, 9000]);
    assert!(route.upstreams[0].is_https() && !route.upstreams[2].is_https());
    assert_eq!(route.upstreams[0].to_string(), "https://api.example/base");
    assert!(route.upstream_tls.is_some());
    assert!(settings.routes[1].upstream_tls.is_none());
}

#[test]
fn upstream_tls_problems_name_the_route_and_the_setting() {
    let errors = load_text(
        r#"
        [[route]]
        prefix = "/a/"
        upstreams = ["http://127.0.0.1:9000"]
        upstream_tls = { ca_file = "/nonexistent/ca.pem" }
        [[route]]
        prefix = "/b/"
        upstreams = ["https://127.0.0.1:8443"]
        upstream_tls = { cert_file = "/tmp/client.pem" }
        [[route]]
        prefix = "/c/"
        upstreams = ["https://127.0.0.1:8443"]
        upstream_tls = { ca_file = "/nonexistent/ca.pem" }
        [[route]]
        prefix = "/d/"
        upstreams = ["https://127.0.0.1:8443"]
        upstream_tls = { server_name = "not a name", colour = "blue" }
        "#,
        &[],
    )
    .unwrap_err();
    let text = errors.0.join("\n");
    for needle in [
        "route[0].upstream_tls: the route's upstreams are all http://",
        "route[1].upstream_tls: cert_file and key_file must both be set, or both left empty",
        "route[2].upstream_tls.ca_file: /nonexistent/ca.pem: No such file",
        "route[3].upstream_tls.colour: unknown key",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn a_server_name_that_is_no_name_is_refused() {
    let errors = load_text(
        r#"
        [[route]]
        prefix = "/d/"
        upstreams = ["https://127.0.0.1:8443"]
        upstream_tls = { server_name = "not a name" }
        "#,
        &[],
    )
    .unwrap_err();
    let text = errors.0.join("\n");
    assert!(
        text.contains(r#"route[0].upstream_tls.server_name: "not a name" is not a DNS name"#),
        "{text}"
    );
}

#[test]
fn a_store_url_of_another_scheme_is_named_without_its_password() {
    let errors = load_text(
        "[store]\nurl = \"mysql://kg:hunter2-secret@db/keygate\"\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        errors.contains(r#"got "mysql://kg:***@db/keygate""#),
        "{errors}"
    );
    assert!(!errors.contains("hunter2-secret"), "{errors}");
}

#[test]
fn oidc_providers_have_documented_defaults() {
    assert!(load_text("", &[]).unwrap().oidc.is_empty());
    let settings = load_text(
        "[server]\npublic_base_url = \"https://gw.example\"\n\
         [[oidc]]\nname = \"corp\"\nissuer = \"https://idp.example/realms/iot\"\n\
         client_id = \"keygate\"\nclient_secret = \"s3cret\"\n",
        &[],
    )
    .unwrap();
    let corp = &settings.oidc[0];
    assert_eq!(corp.issuer, "https://idp.example/realms/iot");
    assert_eq!(corp.scopes, ["openid", "email", "profile"]);
    assert_eq!(corp.button_label, "corp");
    assert_eq!(corp.icon, None);
    assert_eq!(
        (
            corp.email_claim.as_str(),
            corp.first_name_claim.as_str(),
            corp.last_name_claim.as_str()
        ),
        ("email", "given_name", "family_name")
    );
    assert!(corp.require_verified_email);
    assert_eq!(corp.creation, None);
    assert_eq!(corp.authority_rule, None);
    assert!(!corp.trust_provider_mfa);
    assert_eq!(corp.access_token_audience, None);
    assert!(
        !format!("{corp:?}").contains("s3cret"),
        "the secret is never shown"
    );
    let mut secret_file = tempfile::NamedTempFile::new().unwrap();
    secret_file.write_all(b"  from-a-file\n").unwrap();
    let settings = load_text(
        &format!(
            "[server]\npublic_base_url = \"https://gw.example\"\n\
             [[oidc]]\nname = \"local\"\nissuer = \"http://127.0.0.1:9400\"\n\
             client_id = \"keygate\"\nclient_secret_file = \"{}\"\n\
             allow_user_creation = true\nauthority = \"TENANT_ADMIN\"\n\
             tenant_id = \"00000000-0000-0000-0000-000000000011\"\n\
             authority_claim = \"groups\"\nauthority_map = {{ \"admins\" = \"TENANT_ADMIN\" }}\n\
             accept_access_tokens = true\naudience = \"api\"\n",
            secret_file.path().display()
        ),
        &[],
    )
    .unwrap();
    let local = &settings.oidc[0];
    assert_eq!(local.client_secret.expose(), "from-a-file");
    assert_eq!(local.creation.unwrap().authority, Authority::TenantAdmin);
    assert_eq!(local.access_token_audience.as_deref(), Some("api"));
    assert_eq!(
        local.authority_rule.as_ref().unwrap().map,
        [("admins".to_owned(), Authority::TenantAdmin)]
    );
}

#[test]
fn oidc_problems_are_each_named_and_no_secret_is_printed() {
    let errors = load_text(
        "[jwt]\ntoken_issuer = \"https://idp.example\"\n\
         [[oidc]]\nname = \"Corp!\"\nissuer = \"http://idp.example\"\n\
         client_secret = \"hunter2-secret\"\nclient_secret_file = \"/x\"\n\
         scopes = [\"email\"]\nauthority = \"SYS_ADMIN\"\nallow_user_creation = true\n\
         customer_id = \"nope\"\nauthority_map = { \"g\" = \"ROOT\" }\n\
         accept_access_tokens = true\nunknown_key = 1\n\
         [[oidc]]\nname = \"twin\"\nissuer = \"https://idp.example\"\nclient_id = \"c\"\n\
         client_secret = \"s\"\n\
         [[oidc]]\nname = \"twin\"\nissuer = \"https://other.example\"\nclient_id = \"c\"\n\
         client_secret = \"s\"\nca_file = \"/nonexistent/ca.pem\"\n",
        &[],
    )
    .unwrap_err();
    let text = errors.0.join("\n");
    for needle in [
        "oidc[0].unknown_key: unknown key",
        "server.public_base_url: required with [[oidc]]",
        "oidc[0].name: \"Corp!\" must be one or more of a-z 0-9 - _",
        "oidc[0].issuer: \"http://idp.example\": http:// is allowed only for a loopback host",
        "oidc[0].client_id: required",
        "oidc[0].client_secret: set either client_secret or client_secret_file, not both",
        "oidc[0].scopes: must include \"openid\"",
        "oidc[0].authority_map: needs authority_claim",
        "oidc[0].authority: \"SYS_ADMIN\" is not TENANT_ADMIN or CUSTOMER_USER",
        "oidc[0].customer_id: \"nope\" is not a UUID",
        "oidc[0].tenant_id: required with allow_user_creation",
        "oidc[0].audience: required with accept_access_tokens",
        "oidc[1].issuer: \"https://idp.example\" is keygate's own token issuer",
        "oidc[2].name: \"twin\" is used by another [[oidc]]",
        "oidc[2].ca_file: file \"/nonexistent/ca.pem\" does not exist",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert!(!text.contains("hunter2"), "{text}");
}
