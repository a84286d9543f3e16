//! TLS to the store's PostgreSQL: `sslmode` and `sslrootcert` in `store.url`,
//! as libpq reads them, against a server of the test's own that accepts
//! only TLS connections.

mod common;

use std::path::Path;

use common::tls_postgres::TlsPostgres;

use common::run_keygate as keygate;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A config on the store at `url`, serving on port 0 from `dir`.
fn config_on(dir: &Path, url: &str) -> std::path::PathBuf {
    common::config_with_store(dir, &format!("[store]\nurl = \"{url}\"\n"))
}

#[test]
fn verify_full_with_the_servers_ca_connects_and_check_config_says_tls() {
    let Some(server) = TlsPostgres::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = server.url(&format!(
        "sslmode=verify-full&sslrootcert={}",
        server.ca.display()
    ));
    let config = config_on(dir.path(), &url);
    let migrate = keygate(&config, &["--quiet", "migrate"]);
    assert!(migrate.status.success(), "{}", text(&migrate.stderr));
    let check = keygate(&config, &["--quiet", "check-config", "--connect"]);
    let out = text(&check.stdout);
    assert!(check.status.success(), "{}", text(&check.stderr));
    assert!(out.contains("store reached over TLS"), "{out}");
    assert!(out.contains("sslmode=verify-full"), "{out}");
}

#[test]
fn a_server_certificate_from_another_ca_fails_the_start_naming_host_and_reason() {
    let Some(server) = TlsPostgres::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other-ca");
    keygate::tls::load_or_generate_dev(&other).unwrap();
    let (wrong_ca, _, _) = keygate::tls::dev_paths(&other);
    let url = server.url(&format!(
        "sslmode=verify-full&sslrootcert={}",
        wrong_ca.display()
    ));
    let config = config_on(dir.path(), &url);
    let serve = keygate(&config, &["--quiet", "serve"]);
    let err = text(&serve.stderr);
    assert!(!serve.status.success(), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{}", server.port)), "{err}");
    assert!(err.contains("certificate"), "the reason: {err}");
    assert!(
        err.contains("invalid peer certificate"),
        "the reason: {err}"
    );
    assert!(!err.contains("secret-pw"), "never the password: {err}");
    assert!(!err.contains("keygate is serving"), "{err}");
}

#[test]
fn sslmode_disable_is_refused_by_a_server_that_accepts_only_tls() {
    let Some(server) = TlsPostgres::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = config_on(dir.path(), &server.url("sslmode=disable"));
    let migrate = keygate(&config, &["--quiet", "migrate"]);
    let err = text(&migrate.stderr);
    assert!(!migrate.status.success(), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{}", server.port)), "{err}");
    assert!(err.contains("no encryption"), "{err}");
    assert!(!err.contains("secret-pw"), "never the password: {err}");

    // The default, prefer, finds TLS on the same server.
    let config = config_on(dir.path(), &server.url("application_name=keygate"));
    let check = keygate(&config, &["--quiet", "check-config", "--connect"]);
    assert!(check.status.success(), "{}", text(&check.stderr));
    let out = text(&check.stdout);
    assert!(
        out.contains("over TLS") && out.contains("sslmode=prefer"),
        "{out}"
    );
}
