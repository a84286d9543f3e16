//! Migrations as their own step: `keygate migrate`, `keygate migrate --check`
//! and `serve` with `store.migrate = "never"`, on SQLite and on PostgreSQL.

mod common;

use std::path::Path;

use common::run_keygate as keygate;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A config serving on port 0 from `dir`, on the store at `store_url`, that
/// leaves migrating to `keygate migrate`.
fn never_config(dir: &Path, store_url: &str) -> std::path::PathBuf {
    common::config_with_store(
        dir,
        &format!("[store]\nurl = \"{store_url}\"\nmigrate = \"never\"\n"),
    )
}

/// The whole sequence on one store that has no schema yet: the check fails
/// naming what is pending, `serve` refuses, `migrate` applies, then the
/// check passes and `serve` starts.
fn migrations_run_as_their_own_step(dir: &Path, store_url: &str) {
    let config = never_config(dir, store_url);

    let check = keygate(&config, &["--quiet", "migrate", "--check"]);
    let err = text(&check.stderr);
    assert!(!check.status.success(), "behind must fail the check: {err}");
    assert!(
        err.contains("pending") && err.contains("0001_init"),
        "{err}"
    );
    assert!(err.contains("keygate migrate"), "{err}");

    let serve = keygate(&config, &["--quiet", "serve"]);
    let err = text(&serve.stderr);
    assert!(!serve.status.success(), "serve must refuse: {err}");
    for needle in ["pending", "0001_init", "store.migrate", "keygate migrate"] {
        assert!(err.contains(needle), "{needle:?} missing: {err}");
    }
    assert!(!err.contains("keygate is serving"), "{err}");

    let migrate = keygate(&config, &["--quiet", "migrate"]);
    let out = text(&migrate.stdout);
    assert!(migrate.status.success(), "{}", text(&migrate.stderr));
    assert!(
        out.contains("applied") && out.contains("0001_init"),
        "{out}"
    );

    let check = keygate(&config, &["--quiet", "migrate", "--check"]);
    assert!(check.status.success(), "{}", text(&check.stderr));
    assert!(text(&check.stdout).contains("up to date"));

    let again = keygate(&config, &["--quiet", "migrate"]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(text(&again.stdout).contains("up to date"));

    let serving = common::Process::spawn(&config, "info");
    assert!(serving.https > 0, "serve starts on a current schema");
}

#[test]
fn migrate_check_fails_until_migrate_and_serve_never_migrates_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("store").join("k.db");
    let url = format!("sqlite://{}", file.display());
    migrations_run_as_their_own_step(dir.path(), &url);
    assert!(file.is_file(), "migrate creates the store");
}

#[test]
fn migrate_check_never_creates_a_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("k.db");
    let config = never_config(dir.path(), &format!("sqlite://{}", file.display()));
    let check = keygate(&config, &["--quiet", "migrate", "--check"]);
    assert!(!check.status.success());
    assert!(text(&check.stderr).contains("0001_init"));
    assert!(!file.exists(), "a check creates nothing");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
async fn migrate_check_fails_until_migrate_and_serve_never_migrates_on_postgresql() {
    let base = common::test_database_url();
    let (url, schema) = common::fresh_schema(&base).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let result = tokio::task::spawn_blocking(move || {
        migrations_run_as_their_own_step(&path, &url);
    })
    .await;
    common::drop_schema(&base, &schema).await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic.into_panic());
    }
}
