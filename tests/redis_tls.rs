//! TLS to Redis: `rediss://` in `redis.url` and `redis.ca_file`, against a
//! Redis of the test's own that speaks only TLS and wants a password.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::run_keygate as keygate;
use common::tls_redis::{PASSWORD as REDIS_PASSWORD, TlsRedis};
use common::{Gateway, Upstream, error_body};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A `[redis]` section on `url`, trusting `ca` when given.
fn redis_section(url: &str, ca: Option<&Path>, extra: &str) -> String {
    let ca_file = ca.map_or(String::new(), |ca| {
        format!("ca_file = \"{}\"\n", ca.display())
    });
    format!("[redis]\nurl = \"{url}\"\n{ca_file}{extra}")
}

/// A config for the binary serving on port 0 from `dir`, on SQLite, with
/// `redis` (a `[redis]` section), its store migrated.
fn binary_config(dir: &Path, redis: &str) -> PathBuf {
    let store = format!(
        "[store]\nurl = \"sqlite://{}/k.db\"\n{redis}",
        dir.join("data").display()
    );
    let config = common::config_with_store(dir, &store);
    let migrate = keygate(&config, &["--quiet", "migrate"]);
    assert!(migrate.status.success(), "{}", text(&migrate.stderr));
    config
}

/// A key prefix of the test's own.
fn prefix() -> String {
    format!("kgtls:{}:", uuid::Uuid::new_v4().simple())
}

/// Replicas sharing limits under `prefix` through `redis`.
fn replica(redis: &str, prefix: &str) -> String {
    format!(
        "{redis}key_prefix = \"{prefix}\"\ncommand_timeout = \"500ms\"\n\
         [jwt]\ntoken_signing_key = \"{}\"\n[login]\naccount_address_max_failures = 3\n",
        "a".repeat(88)
    )
}

async fn wait_for(gw: &Gateway, line: &str) {
    let started = Instant::now();
    while !gw.metrics().await.lines().any(|l| l == line) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{line} not within 10 s:\n{}",
            gw.metrics().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn rediss_with_the_ca_file_shares_failed_logins_between_replicas() {
    let Some(server) = TlsRedis::start() else {
        return;
    };
    let prefix = prefix();
    let upstream = Upstream::start().await;
    let config = replica(&redis_section(&server.url(), Some(&server.ca), ""), &prefix);
    let a = Gateway::start(&upstream.url(), &config).await;
    let b = Gateway::start(&upstream.url(), &config).await;
    wait_for(&a, "keygate_redis_up 1").await;
    wait_for(&b, "keygate_redis_up 1").await;
    for gw in [&a, &b, &a] {
        let (status, _) = error_body(gw.login("tls-victim@example.com", "guess").await).await;
        assert_eq!(status, 401);
    }
    // Each replica saw at most two failures: only the count in Redis refuses.
    let (status, json) = error_body(b.login("tls-victim@example.com", "guess").await).await;
    assert_eq!(
        (status, json["errorCode"].as_u64()),
        (429, Some(33)),
        "{json}"
    );

    // The count is in the TLS Redis, under this test's prefix.
    let mut connection = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(
        keys.iter().any(|k| k.contains(":login:account:")),
        "{keys:?}"
    );
    let _: () = redis::cmd("DEL")
        .arg(keys)
        .query_async(&mut connection)
        .await
        .unwrap();
}

#[test]
fn check_config_connect_says_redis_is_reached_over_tls() {
    let Some(server) = TlsRedis::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = binary_config(
        dir.path(),
        &redis_section(&server.url(), Some(&server.ca), ""),
    );
    let check = keygate(&config, &["--quiet", "check-config", "--connect"]);
    let out = text(&check.stdout);
    assert!(check.status.success(), "{}{out}", text(&check.stderr));
    assert!(out.contains("Redis reached over TLS (TLSv1.3)"), "{out}");
    assert!(!out.contains(REDIS_PASSWORD), "{out}");

    // SSL_CERT_FILE is honoured as the system's roots, without redis.ca_file.
    let config = binary_config(dir.path(), &redis_section(&server.url(), None, ""));
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_keygate"))
        .arg("--config")
        .arg(&config)
        .args(["--quiet", "check-config", "--connect"])
        .env("RUST_LOG", "warn")
        .env("SSL_CERT_FILE", &server.ca)
        .env_remove("SSL_CERT_DIR")
        .env_remove("KEYGATE_CONFIG")
        .env_remove("KEYGATE_STORE_URL")
        .output()
        .unwrap();
    let out = text(&check.stdout);
    assert!(check.status.success(), "{}{out}", text(&check.stderr));
    assert!(out.contains("Redis reached over TLS (TLSv1.3)"), "{out}");
}

#[test]
fn a_redis_certificate_from_another_ca_fails_the_start_naming_host_and_reason() {
    let Some(server) = TlsRedis::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other-ca");
    keygate::tls::load_or_generate_dev(&other).unwrap();
    let (wrong_ca, _, _) = keygate::tls::dev_paths(&other);
    let config = binary_config(
        dir.path(),
        &redis_section(&server.url(), Some(&wrong_ca), ""),
    );
    let serve = keygate(&config, &["--quiet", "serve"]);
    let err = text(&serve.stderr);
    assert!(!serve.status.success(), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{}", server.port)), "{err}");
    assert!(
        err.contains("invalid peer certificate"),
        "the reason: {err}"
    );
    assert!(err.contains("redis.ca_file"), "what to change: {err}");
    assert!(!err.contains(REDIS_PASSWORD), "never the password: {err}");
    assert!(!err.contains("keygate is serving"), "{err}");

    // check-config --connect names the same problem.
    let check = keygate(&config, &["--quiet", "check-config", "--connect"]);
    let out = format!("{}{}", text(&check.stdout), text(&check.stderr));
    assert!(!check.status.success(), "{out}");
    assert!(out.contains("invalid peer certificate"), "{out}");
    assert!(!out.contains(REDIS_PASSWORD), "never the password: {out}");
}

#[tokio::test]
async fn redis_url_against_the_tls_port_is_redis_out_of_reach_and_limits_stay_local() {
    let Some(server) = TlsRedis::start() else {
        return;
    };
    // As with any Redis out of reach: the start goes on, and password
    // attempts are limited by this replica's own windows.
    let prefix = prefix();
    let upstream = Upstream::start().await;
    let config = replica(
        &redis_section(&server.plain_url(), None, "connect_timeout = \"300ms\"\n"),
        &prefix,
    );
    let gw = Gateway::start(&upstream.url(), &config).await;
    for _ in 0..3 {
        let (status, _) = error_body(gw.login("plain-victim@example.com", "guess").await).await;
        assert_eq!(status, 401);
    }
    let (status, _) = error_body(gw.login("plain-victim@example.com", "guess").await).await;
    assert_eq!(status, 429, "never unchecked while Redis is out of reach");
    wait_for(&gw, "keygate_redis_up 0").await;
    let metrics = gw.metrics().await;
    assert!(
        !metrics.contains(r#"keygate_redis_fallbacks_total{limits="login"} 0"#),
        "{metrics}"
    );

    // check-config --connect says it cannot reach it, without the password.
    let dir = tempfile::tempdir().unwrap();
    let config = binary_config(dir.path(), &redis_section(&server.plain_url(), None, ""));
    let check = keygate(&config, &["--quiet", "check-config", "--connect"]);
    let out = format!("{}{}", text(&check.stdout), text(&check.stderr));
    assert!(!check.status.success(), "{out}");
    assert!(
        out.contains(&format!(
            "redis.url: cannot reach redis://:***@127.0.0.1:{}/",
            server.port
        )),
        "{out}"
    );
    assert!(!out.contains(REDIS_PASSWORD), "{out}");
}

#[tokio::test]
async fn rediss_to_a_closed_port_starts_and_decides_locally() {
    let dir = tempfile::tempdir().unwrap();
    keygate::tls::load_or_generate_dev(dir.path()).unwrap();
    let (ca, _, _) = keygate::tls::dev_paths(dir.path());
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let prefix = prefix();
    let upstream = Upstream::start().await;
    let url = format!("rediss://:{REDIS_PASSWORD}@127.0.0.1:{port}/");
    let config = replica(
        &redis_section(&url, Some(&ca), "connect_timeout = \"300ms\"\n"),
        &prefix,
    );
    let gw = Gateway::start(&upstream.url(), &config).await;
    let (status, _) = error_body(gw.login("closed-victim@example.com", "guess").await).await;
    assert_eq!(status, 401);
    wait_for(&gw, "keygate_redis_up 0").await;
}
