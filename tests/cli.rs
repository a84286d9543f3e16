//! The `keygate` command line: config checking, users and keys, and CLI changes
//! reaching a running server within the cache bound.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Gateway, Upstream};

fn keygate(config: &Path, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_keygate"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("KEYGATE_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn check_config_reports_every_problem_at_once_and_exits_64() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[listen]\nhttps = \"nope\"\ncolour = 1\n[jwt]\ntoken_expiration_time = 10\n[[route]]\nprefix = \"x\"\nupstreams = []\n",
    )
    .unwrap();
    let out = keygate(&path, &["check-config"], "");
    assert_eq!(out.status.code(), Some(64));
    let err = text(&out.stderr);
    for needle in [
        "listen.https",
        "listen.colour: unknown key",
        "at least 60 seconds",
        "route[0].prefix",
        "route[0].upstreams",
    ] {
        assert!(err.contains(needle), "{needle:?} missing from:\n{err}");
    }
    let good = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/keygate.toml");
    let out = keygate(&good, &["check-config"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn check_config_refuses_bad_ports_in_every_url_setting() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ports.toml");
    std::fs::write(
        &path,
        "[server]\npublic_base_url = \"https://keygate.example:70000\"\n\
         [[route]]\nprefix = \"/api/\"\nupstreams = [\"http://127.0.0.1:notaport\", \"http://127.0.0.1:99999\"]\n\
         openapi = \"http://127.0.0.1:0/v3/api-docs\"\n",
    )
    .unwrap();
    let out = keygate(&path, &["check-config"], "");
    assert_eq!(out.status.code(), Some(64));
    let err = text(&out.stderr);
    let problems: Vec<&str> = err.lines().filter(|l| l.starts_with("  - ")).collect();
    assert_eq!(
        problems,
        [
            r#"  - route[0].upstreams: "http://127.0.0.1:notaport": port "notaport" is not a number from 1 to 65535"#,
            r#"  - route[0].upstreams: "http://127.0.0.1:99999": port "99999" is not a number from 1 to 65535"#,
            r#"  - route[0].openapi: "http://127.0.0.1:0/v3/api-docs": port "0" is not a number from 1 to 65535"#,
            r#"  - server.public_base_url: "https://keygate.example:70000": port "70000" is not a number from 1 to 65535"#,
        ],
        "{err}"
    );
}

#[test]
fn check_config_refuses_two_assertion_routes_sharing_an_audience_and_names_both() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audiences.toml");
    std::fs::write(
        &path,
        "[[route]]\nname = \"billing\"\nprefix = \"/api/billing/\"\n\
         upstreams = [\"http://127.0.0.1:9001\"]\nidentity = \"assertion\"\n\
         [[route]]\nname = \"reports\"\nprefix = \"/api/reports/\"\n\
         upstreams = [\"http://127.0.0.1:9002\"]\nidentity = \"assertion\"\naudience = \"billing\"\n",
    )
    .unwrap();
    let out = keygate(&path, &["check-config"], "");
    assert_eq!(out.status.code(), Some(64));
    let err = text(&out.stderr);
    let problems: Vec<&str> = err.lines().filter(|l| l.starts_with("  - ")).collect();
    assert_eq!(problems.len(), 1, "{err}");
    for needle in [
        "route[1].audience: \"billing\" is also the audience of route[0]",
        "\"/api/billing/\"",
        "\"/api/reports/\"",
    ] {
        assert!(
            problems[0].contains(needle),
            "{needle:?} missing from:\n{err}"
        );
    }
}

#[tokio::test]
async fn cli_created_key_works_and_cli_disable_applies_within_the_cache_bound() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(
        &upstream.url(),
        "[cache]\nttl = \"1s\"\nnegative_ttl = \"1s\"\n",
    )
    .await;
    let config = gw.dir.path().join("keygate.toml");

    let out = keygate(
        &config,
        &[
            "user",
            "add",
            "--email",
            "Cli@Example.com",
            "--authority",
            "TENANT_ADMIN",
            "--tenant-id",
            "5f1c0c9e-1d2a-4c3b-9e8f-0a1b2c3d4e5f",
        ],
        "a-long-password\n",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = keygate(
        &config,
        &[
            "user",
            "add",
            "--email",
            "short@example.com",
            "--authority",
            "SYS_ADMIN",
        ],
        "short\n",
    );
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("at least 8 characters"));

    let out = keygate(
        &config,
        &[
            "apikey",
            "create",
            "--email",
            "cli@example.com",
            "--description",
            "ci",
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let key = stdout.lines().last().unwrap().to_string();
    assert!(key.starts_with("tb_") && key.len() == 89, "{stdout:?}");
    assert!(
        !text(&out.stderr).contains(&key),
        "the key is printed on stdout only"
    );

    let out = keygate(
        &config,
        &["apikey", "list", "--email", "cli@example.com", "--json"],
        "",
    );
    let listing = text(&out.stdout);
    assert!(!listing.contains(&key), "{listing}");
    let keys: serde_json::Value = serde_json::from_str(&listing).unwrap();
    assert_eq!(keys[0]["description"], "ci", "{listing}");
    let key_id = keys[0]["id"].as_str().unwrap().to_string();

    let client = gw.client();
    let call = || {
        client
            .get(gw.https("/api/devices"))
            .header("X-Authorization", common::api_key_header(&key))
            .send()
    };
    assert_eq!(call().await.unwrap().status(), 200);

    let out = keygate(&config, &["apikey", "disable", &key_id], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let started = Instant::now();
    loop {
        let status = call().await.unwrap().status();
        if status == 401 {
            break;
        }
        // Ten times the 1 s cache bound, a third of the default one (30 s).
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "still accepted long after the 1 s cache bound"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let out = keygate(&config, &["user", "list"], "");
    assert!(text(&out.stdout).contains("cli@example.com"));
    let out = keygate(&config, &["user", "delete", "cli@example.com"], "");
    assert!(out.status.success());
    let out = keygate(&config, &["apikey", "enable", &key_id], "");
    assert!(!out.status.success(), "the user's keys went with the user");

    // Every change made above is in the audit trail, newest first; the
    // refused user and the failed enable left none.
    let out = keygate(&config, &["audit", "--limit", "10", "--json"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let actions: Vec<(&str, &str)> = events
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["actor"].as_str().unwrap()))
        .collect();
    assert_eq!(
        actions,
        [
            ("user.delete", "command-line"),
            ("api_key.disable", "command-line"),
            ("api_key.create", "command-line"),
            ("user.create", "command-line"),
        ]
    );
    assert_eq!(events[1]["targetId"], key_id.as_str());
    assert_eq!(events[1]["targetType"], "API_KEY");
    assert!(
        !text(&out.stdout).contains(&key),
        "an audit event never holds a secret"
    );
}

#[tokio::test]
async fn a_key_disabled_by_the_cli_is_refused_by_a_running_sqlite_server_within_3_s() {
    let upstream = Upstream::start().await;
    // The default cache bound (30 s): the server must learn of the change
    // from the store, not from its caches expiring.
    let gw = Gateway::start(&upstream.url(), "").await;
    let config = gw.dir.path().join("keygate.toml");
    let out = keygate(
        &config,
        &[
            "user",
            "add",
            "--email",
            "poll@example.com",
            "--authority",
            "TENANT_ADMIN",
            "--tenant-id",
            "5f1c0c9e-1d2a-4c3b-9e8f-0a1b2c3d4e5f",
        ],
        "a-long-password\n",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = keygate(
        &config,
        &["apikey", "create", "--email", "poll@example.com"],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let key = text(&out.stdout).lines().last().unwrap().to_string();
    let out = keygate(
        &config,
        &["apikey", "list", "--email", "poll@example.com", "--json"],
        "",
    );
    let keys: serde_json::Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    let key_id = keys[0]["id"].as_str().unwrap().to_string();

    let client = gw.client();
    let call = || {
        client
            .get(gw.https("/api/devices"))
            .header("X-Authorization", common::api_key_header(&key))
            .send()
    };
    // Twice: the second answer comes from the cache.
    assert_eq!(call().await.unwrap().status(), 200);
    assert_eq!(call().await.unwrap().status(), 200);

    let out = keygate(&config, &["apikey", "disable", &key_id], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let disabled = Instant::now();
    loop {
        if call().await.unwrap().status() == 401 {
            break;
        }
        assert!(
            disabled.elapsed() < Duration::from_secs(3),
            "a key disabled from the command line was still accepted 3 s later"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn cli_read_only_and_scoped_keys_are_refused_outside_their_scopes() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(&upstream.url(), "").await;
    let config = gw.dir.path().join("keygate.toml");
    let out = keygate(
        &config,
        &[
            "user",
            "add",
            "--email",
            "scoped-cli@example.com",
            "--authority",
            "TENANT_ADMIN",
            "--tenant-id",
            "5f1c0c9e-1d2a-4c3b-9e8f-0a1b2c3d4e5f",
        ],
        "a-long-password\n",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let create = |extra: &[&str]| {
        let mut args = vec!["apikey", "create", "--email", "scoped-cli@example.com"];
        args.extend_from_slice(extra);
        keygate(&config, &args, "")
    };
    let out = create(&["--read-only"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let reader = text(&out.stdout).lines().last().unwrap().to_string();
    let out = create(&[
        "--scope",
        "GET,post /api/device/",
        "--scope",
        "DELETE /api/alarm",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let writer = text(&out.stdout).lines().last().unwrap().to_string();
    for bad in [
        &["--scope", "FETCH /api"][..],
        &["--scope", "GET api"],
        &["--scope", "GET"],
    ] {
        let out = create(bad);
        assert!(!out.status.success(), "{bad:?} was accepted");
        assert!(text(&out.stderr).contains("scope"), "{}", text(&out.stderr));
    }
    let out = create(&["--read-only", "--scope", "GET /api"]);
    assert!(!out.status.success(), "--read-only and --scope together");

    let out = keygate(
        &config,
        &["apikey", "list", "--email", "scoped-cli@example.com"],
        "",
    );
    let listing = text(&out.stdout);
    assert!(listing.contains("[GET /]"), "{listing}");
    assert!(
        listing.contains("[GET,POST /api/device/; DELETE /api/alarm]"),
        "{listing}"
    );

    let client = gw.client();
    let call = |method: reqwest::Method, path: &str, key: &str| {
        client
            .request(method, gw.https(path))
            .header("X-Authorization", common::api_key_header(key))
            .send()
    };
    assert_eq!(
        call(reqwest::Method::GET, "/api/tenant/devices", &reader)
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        call(reqwest::Method::POST, "/api/device/x", &reader)
            .await
            .unwrap()
            .status(),
        403
    );
    assert_eq!(
        call(reqwest::Method::POST, "/api/device/x", &writer)
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        call(reqwest::Method::DELETE, "/api/alarm/1", &writer)
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        call(reqwest::Method::GET, "/api/alarms", &writer)
            .await
            .unwrap()
            .status(),
        403
    );
    assert_eq!(
        upstream.requests().len(),
        3,
        "only what the scopes hold was forwarded"
    );
}

#[tokio::test]
async fn first_start_creates_the_bootstrap_admin_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/k.db", dir.path().display());
    let store = keygate::store::Store::connect(&url, 2).await.unwrap();
    let keygate::accounts::Bootstrap::Created {
        generated: Some(generated),
    } = keygate::accounts::bootstrap_admin(&store, None, &Default::default())
        .await
        .unwrap()
    else {
        panic!("an empty store gets its administrator with a generated password");
    };
    assert!(generated.len() >= 20);
    let admin = store
        .user_by_email("sysadmin@keygate.local")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(admin.authority, keygate::identity::Authority::SysAdmin);
    assert!(keygate::auth::password::verify_blocking(
        &generated,
        &admin.password_hash
    ));
    assert_eq!(
        keygate::accounts::bootstrap_admin(&store, None, &Default::default())
            .await
            .unwrap(),
        keygate::accounts::Bootstrap::StoreHasUsers
    );
}

#[tokio::test]
async fn cli_refuses_a_tenant_admin_with_the_no_tenant_id() {
    let (_upstream, gw) = common::gateway("").await;
    let config = gw.dir.path().join("keygate.toml");
    let out = keygate(
        &config,
        &[
            "user",
            "add",
            "--email",
            "sneaky@example.com",
            "--authority",
            "TENANT_ADMIN",
            "--tenant-id",
            "13814000-1dd2-11b2-8080-808080808080",
        ],
        "a-long-password\n",
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("tenant id other than"),
        "{}",
        text(&out.stderr)
    );
    let stored = gw
        .running
        .store
        .user_by_email("sneaky@example.com")
        .await
        .unwrap();
    assert!(stored.is_none(), "nothing half-created");
}

#[tokio::test]
async fn admin_password_reset_from_the_cli_ends_every_earlier_session() {
    let (_upstream, gw) = common::gateway("[cache]\nttl = \"1s\"\n").await;
    let config = gw.dir.path().join("keygate.toml");
    let user = gw
        .user(
            "reset@example.com",
            keygate::identity::Authority::TenantAdmin,
        )
        .await;
    let (_, token) = gw.access_token(&user).await;
    let call = || {
        gw.client()
            .get(gw.https("/api/devices"))
            .header("X-Authorization", format!("Bearer {token}"))
            .send()
    };
    assert_eq!(call().await.unwrap().status(), 200);
    // Tokens issued in the same second as the reset would still count as new.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let out = keygate(
        &config,
        &["user", "set-password", "reset@example.com"],
        "reset-by-admin-password\n",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The CLI is another process: the server's caches see it within their TTL,
    // the store at once (the session ended).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = call().await.unwrap().status();
        if status == 401 {
            break;
        }
        assert!(Instant::now() < deadline, "the old token still works");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let login = gw
        .client()
        .post(gw.https("/api/auth/login"))
        .json(&serde_json::json!({"username": "reset@example.com", "password": "reset-by-admin-password"}))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 200);
}

/// [`store_only_config`] with its store created (as a first `serve` would).
fn store_ready_config(dir: &Path) -> std::path::PathBuf {
    let config = store_only_config(dir);
    let url = format!("sqlite://{}/k.db", dir.display());
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            keygate::store::Store::connect(&url, 1)
                .await
                .unwrap()
                .close()
                .await
        });
    config
}

/// A config whose only dependency is a SQLite store in `dir`.
fn store_only_config(dir: &Path) -> std::path::PathBuf {
    let data = dir.display();
    let path = dir.join("keygate.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\ndata_dir = \"{data}\"\n[store]\nurl = \"sqlite://{data}/k.db\"\n\
             [[route]]\nname = \"api\"\nprefix = \"/api/\"\nupstreams = [\"http://127.0.0.1:9\"]\n"
        ),
    )
    .unwrap();
    path
}

/// The entries of one section ("Commands:", "Options:", "Arguments:") of a
/// help text, each with its description ("" when it has none).
fn help_entries<'a>(help: &'a str, section: &str) -> Vec<(&'a str, &'a str)> {
    let mut lines = help.lines().skip_while(|l| *l != section).skip(1);
    let mut entries = Vec::new();
    for line in lines.by_ref() {
        if !line.starts_with("  ") {
            break;
        }
        let entry = line.trim_start();
        // The name ends where a run of two spaces starts the description.
        match entry.split_once("  ") {
            Some((name, description)) => entries.push((name, description.trim())),
            None => entries.push((entry, "")),
        }
    }
    entries
}

#[test]
fn every_subcommand_and_flag_has_help_text() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_only_config(dir.path());
    let mut pending = vec![Vec::<String>::new()];
    let mut seen = 0;
    while let Some(path) = pending.pop() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("-h");
        let out = keygate(&config, &args, "");
        let help = text(&out.stdout);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        assert!(
            !help.lines().next().unwrap_or("").starts_with("Usage:"),
            "`keygate {}` has no description:\n{help}",
            path.join(" ")
        );
        for section in ["Options:", "Arguments:"] {
            for (name, description) in help_entries(&help, section) {
                assert!(
                    !description.is_empty(),
                    "`keygate {} {name}` has no help:\n{help}",
                    path.join(" ")
                );
            }
        }
        for (name, description) in help_entries(&help, "Commands:") {
            assert!(
                !description.is_empty(),
                "`keygate {} {name}` has no description",
                path.join(" ")
            );
            if name != "help" {
                let mut sub = path.clone();
                sub.push(name.to_string());
                pending.push(sub);
            }
        }
        seen += 1;
    }
    assert!(seen >= 17, "walked {seen} commands");

    let out = keygate(&config, &["help", "user", "add"], "");
    let help = text(&out.stdout);
    for needle in [
        "SYS_ADMIN",
        "TENANT_ADMIN",
        "CUSTOMER_USER",
        "platform's UUID",
        "13814000-1dd2-11b2-8080-808080808080",
        "standard input",
    ] {
        assert!(help.contains(needle), "{needle:?} missing from:\n{help}");
    }
}

#[test]
fn user_add_with_empty_standard_input_says_where_the_password_is_read_from() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_ready_config(dir.path());
    let args = [
        "user",
        "add",
        "--email",
        "nopass@example.com",
        "--authority",
        "SYS_ADMIN",
    ];
    let out = keygate(&config, &args, "");
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("no password given") && err.contains("first line of standard input"),
        "{err}"
    );
    let out = keygate(&config, &["user", "list"], "");
    assert!(
        !text(&out.stdout).contains("nopass@example.com"),
        "nothing created"
    );
}

#[test]
fn counts_are_printed_with_the_right_plural() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_only_config(dir.path());
    let out = keygate(&config, &["check-config"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "configuration is valid (1 route)");

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[listen]\nhttps = \"nope\"\n").unwrap();
    let out = keygate(&bad, &["check-config"], "");
    assert_eq!(out.status.code(), Some(64));
    let err = text(&out.stderr);
    assert!(err.contains("invalid configuration (1 problem):"), "{err}");
}

#[test]
fn health_against_a_stopped_server_names_the_address_and_the_reason_once() {
    let dir = tempfile::tempdir().unwrap();
    let addr = {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        closed.local_addr().unwrap()
    };
    let config = dir.path().join("keygate.toml");
    std::fs::write(&config, format!("[listen]\nadmin = \"{addr}\"\n")).unwrap();
    let out = keygate(&config, &["--quiet", "health"], "");
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line:\n{err}");
    assert!(err.contains(&addr.to_string()), "names {addr}: {err}");
    assert_eq!(
        err.to_lowercase().matches("refused").count(),
        1,
        "the reason once: {err}"
    );
}

/// Runs `keygate` under a pseudo-terminal (util-linux `script`), typing each
/// of `answers` once `prompt` shows; returns the exit code and all terminal output.
fn at_a_terminal(config: &Path, args: &[&str], answers: &[(&str, &str)]) -> Option<(i32, String)> {
    use std::io::Read;
    use std::sync::{Arc, Mutex};
    if Command::new("script").arg("--version").output().is_err() {
        common::skipped_without("util-linux `script`", "the password prompt at a terminal");
        return None;
    }
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let mut line = quote(env!("CARGO_BIN_EXE_keygate"));
    for arg in ["--config", &config.display().to_string()]
        .iter()
        .map(|s| s.as_ref())
        .chain(args.iter().copied())
    {
        line.push(' ');
        line.push_str(&quote(arg));
    }
    let mut child = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("RUST_LOG", "warn")
        .env_remove("KEYGATE_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let output = Arc::new(Mutex::new(Vec::new()));
    let mut stdout = child.stdout.take().unwrap();
    let sink = output.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    let seen = || String::from_utf8_lossy(&output.lock().unwrap()).into_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut stdin = child.stdin.take().unwrap();
    let mut shown = 0;
    for (prompt, answer) in answers {
        // Type only once the prompt shows: echo is off by then.
        loop {
            let text = seen();
            if let Some(at) = text[shown..].find(prompt) {
                shown += at + prompt.len();
                break;
            }
            assert!(Instant::now() < deadline, "no {prompt:?} prompt:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
        stdin.write_all(format!("{answer}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "keygate did not finish:\n{}",
            seen()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(stdin);
    reader.join().unwrap();
    Some((status.code().unwrap_or(-1), seen()))
}

#[tokio::test]
async fn a_password_typed_at_a_terminal_is_asked_for_and_not_echoed() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_only_config(dir.path());
    keygate::store::Store::connect(&format!("sqlite://{}/k.db", dir.path().display()), 1)
        .await
        .unwrap()
        .close()
        .await;
    let password = "typed-at-a-terminal-42";
    let Some((code, screen)) = at_a_terminal(
        &config,
        &[
            "user",
            "add",
            "--email",
            "tty@example.com",
            "--authority",
            "SYS_ADMIN",
        ],
        &[
            ("Password: ", password),
            ("Repeat the password: ", password),
        ],
    ) else {
        return;
    };
    assert_eq!(code, 0, "{screen}");
    assert!(screen.contains("created user tty@example.com"), "{screen}");
    assert!(
        !screen.contains(password),
        "the password showed on the terminal:\n{screen}"
    );
    let store =
        keygate::store::Store::connect(&format!("sqlite://{}/k.db", dir.path().display()), 1)
            .await
            .unwrap();
    let user = store
        .user_by_email("tty@example.com")
        .await
        .unwrap()
        .unwrap();
    assert!(keygate::auth::password::verify_blocking(
        password,
        &user.password_hash
    ));

    let Some((code, screen)) = at_a_terminal(
        &config,
        &["user", "set-password", "tty@example.com"],
        &[
            ("Password: ", "first-new-password"),
            ("Repeat the password: ", "second-new-password"),
        ],
    ) else {
        return;
    };
    assert_ne!(code, 0, "{screen}");
    assert!(screen.contains("do not match"), "{screen}");
}

/// `keygate` run in `cwd` with `args` as given (no `--config` added) and
/// `env` on top of a clean environment for keygate's own variables.
fn keygate_in(cwd: &Path, args: &[&str], env: &[(&str, &str)], stdin: &str) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keygate"));
    command
        .current_dir(cwd)
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("KEYGATE_CONFIG")
        .env_remove("KEYGATE_STORE_URL")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

const TENANT: &str = "5f1c0c9e-1d2a-4c3b-9e8f-0a1b2c3d4e5f";

#[test]
fn management_commands_never_create_a_store_and_name_the_config_and_store_looked_for() {
    let dir = tempfile::tempdir().unwrap();
    // Run from a directory with no config: built-in defaults, ./data/keygate.db.
    let out = keygate_in(dir.path(), &["user", "list"], &[], "");
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("built-in defaults") && err.contains("sqlite://data/keygate.db"),
        "{err}"
    );
    assert!(err.contains("no store at data/keygate.db"), "{err}");
    assert!(
        !dir.path().join("data").exists(),
        "no directory or store was created"
    );

    // A store URL in a directory that does not exist: refused, not created.
    let missing = dir.path().join("nonexistent/dir/k.db");
    let url = format!("sqlite://{}", missing.display());
    let config = dir.path().join("keygate.toml");
    std::fs::write(&config, "").unwrap();
    let out = keygate_in(
        dir.path(),
        &[
            "--config",
            config.to_str().unwrap(),
            "apikey",
            "list",
            "--email",
            "a@b.c",
        ],
        &[("KEYGATE_STORE_URL", &url)],
        "",
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    let refusal: Vec<&str> = err.lines().filter(|l| l.contains("no store at")).collect();
    assert_eq!(refusal.len(), 1, "one line:\n{err}");
    assert!(
        refusal[0].contains(&url) && refusal[0].contains(config.to_str().unwrap()),
        "names the store URL and the config file: {err}"
    );
    assert!(!dir.path().join("nonexistent").exists());
}

#[test]
fn every_command_says_which_config_and_store_it_uses_unless_quiet() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_ready_config(dir.path());
    let store = format!("sqlite://{}/k.db", dir.path().display());
    for args in [&["user", "list"][..], &["check-config"], &["audit"]] {
        let out = keygate(&config, args, "");
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        let err = text(&out.stderr);
        let said: Vec<&str> = err.lines().filter(|l| l.contains(&store)).collect();
        assert_eq!(said.len(), 1, "{args:?}:\n{err}");
        assert!(said[0].contains(config.to_str().unwrap()), "{err}");
        let mut quiet = vec!["--quiet"];
        quiet.extend_from_slice(args);
        let out = keygate(&config, &quiet, "");
        assert!(out.status.success());
        assert_eq!(text(&out.stderr), "", "{quiet:?} prints nothing on stderr");
    }
}

#[test]
fn an_unreachable_postgresql_is_named_in_one_line_without_a_long_wait() {
    let dir = tempfile::tempdir().unwrap();
    let port = {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        closed.local_addr().unwrap().port()
    };
    let config = dir.path().join("keygate.toml");
    std::fs::write(
        &config,
        format!("[store]\nurl = \"postgres://kg:secret-pw@127.0.0.1:{port}/keygate\"\n"),
    )
    .unwrap();
    let started = Instant::now();
    let out = keygate(&config, &["--quiet", "user", "list"], "");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line:\n{err}");
    for needle in [
        format!("127.0.0.1:{port}"),
        "database \"keygate\"".to_string(),
        "connection refused".to_string(),
    ] {
        assert!(err.contains(&needle), "{needle:?} missing: {err}");
    }
    assert_eq!(err.matches("refused").count(), 1, "the cause once: {err}");
    assert!(!err.contains("secret-pw"), "never the password: {err}");
}

#[test]
#[ignore = "needs PostgreSQL: set KEYGATE_TEST_DATABASE_URL and run with --include-ignored"]
fn a_missing_postgresql_database_is_named_once() {
    let base = common::test_database_url();
    let url = match base.rsplit_once('/') {
        Some((server, _)) => format!("{server}/keygate_no_such_database"),
        None => panic!("{base} names no database"),
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("keygate.toml");
    std::fs::write(&config, format!("[store]\nurl = \"{url}\"\n")).unwrap();
    let out = keygate(&config, &["--quiet", "user", "list"], "");
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line:\n{err}");
    assert_eq!(
        err.matches("\"keygate_no_such_database\" does not exist")
            .count(),
        1,
        "{err}"
    );
}

#[test]
fn listings_have_a_header_readable_times_and_a_json_form() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_ready_config(dir.path());
    let add = |email: &str, authority: &str, tenant: Option<&str>| {
        let mut args = vec!["user", "add", "--email", email, "--authority", authority];
        if let Some(tenant) = tenant {
            args.extend(["--tenant-id", tenant]);
        }
        let out = keygate(&config, &args, "a-long-password\n");
        assert!(out.status.success(), "{}", text(&out.stderr));
    };
    add("root@example.com", "sys_admin", None);
    add("admin@example.com", "Tenant_Admin", Some(TENANT));

    let out = keygate(&config, &["user", "list"], "");
    let listing = text(&out.stdout);
    let mut lines = listing.lines();
    let header = lines.next().unwrap();
    for column in ["ID", "AUTHORITY", "STATE", "TENANT", "CREATED", "EMAIL"] {
        assert!(header.contains(column), "{header}");
    }
    let root = lines.clone().find(|l| l.contains("root@")).unwrap();
    let admin = lines.find(|l| l.contains("admin@")).unwrap();
    assert!(
        root.contains("SYS_ADMIN") && root.contains("  -  "),
        "{root}"
    );
    assert!(
        !root.contains("13814000"),
        "the no-tenant id shows as -: {root}"
    );
    assert!(
        admin.contains("TENANT_ADMIN") && admin.contains(TENANT),
        "{admin}"
    );
    assert!(admin.contains(" UTC "), "a readable creation time: {admin}");

    let out = keygate(&config, &["user", "list", "--json"], "");
    let users: serde_json::Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    let root = users
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["email"] == "root@example.com")
        .unwrap();
    assert!(root["tenantId"].is_null(), "{root}");
    assert!(root["createdTime"].as_i64().unwrap() > 1_600_000_000_000);

    let out = keygate(
        &config,
        &[
            "apikey",
            "create",
            "--email",
            "admin@example.com",
            "--expires-in",
            "30d",
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = keygate(
        &config,
        &["apikey", "list", "--email", "admin@example.com"],
        "",
    );
    let listing = text(&out.stdout);
    let mut lines = listing.lines();
    let header = lines.next().unwrap();
    for column in ["ID", "STATE", "CREATED", "EXPIRES", "DESCRIPTION"] {
        assert!(header.contains(column), "{header}");
    }
    let row = lines.next().unwrap();
    assert_eq!(
        row.matches(" UTC").count(),
        2,
        "created and expiry times: {row}"
    );
}

#[test]
fn apikey_disable_given_a_key_value_asks_for_the_id_without_repeating_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_ready_config(dir.path());
    let value = format!("tb_{}", "A1b2".repeat(21));
    let out = keygate(&config, &["apikey", "disable", &value], "");
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("value, not its id") && err.contains("apikey list"),
        "{err}"
    );
    assert!(!err.contains(&value), "the key value is not echoed: {err}");
}

#[test]
fn disabling_an_already_disabled_user_says_so_and_records_no_second_event() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_ready_config(dir.path());
    let out = keygate(
        &config,
        &[
            "user",
            "add",
            "--email",
            "twice@example.com",
            "--authority",
            "SYS_ADMIN",
        ],
        "a-long-password\n",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = keygate(&config, &["user", "disable", "twice@example.com"], "");
    assert_eq!(text(&out.stdout).trim(), "disabled user twice@example.com");
    let out = keygate(&config, &["user", "disable", "twice@example.com"], "");
    assert!(out.status.success());
    assert!(
        text(&out.stdout).contains("already disabled"),
        "{}",
        text(&out.stdout)
    );
    let out = keygate(
        &config,
        &["audit", "--json", "--action", "user.disable"],
        "",
    );
    assert_eq!(
        text(&out.stdout).lines().count(),
        1,
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn audit_filters_by_time_user_and_action_and_shows_readable_times() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_ready_config(dir.path());
    for email in ["one@example.com", "two@example.com"] {
        let out = keygate(
            &config,
            &["user", "add", "--email", email, "--authority", "SYS_ADMIN"],
            "a-long-password\n",
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    keygate(&config, &["user", "disable", "two@example.com"], "");
    let events = |args: &[&str]| -> Vec<serde_json::Value> {
        let mut all = vec!["audit", "--json"];
        all.extend_from_slice(args);
        let out = keygate(&config, &all, "");
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    assert_eq!(events(&[]).len(), 3);
    assert_eq!(events(&["--since", "1h"]).len(), 3);
    assert_eq!(events(&["--since", "2999-01-01T00:00:00Z"]).len(), 0);
    let two = events(&["--user", "TWO@example.com"]);
    assert_eq!(two.len(), 2, "{two:?}");
    let disabled = events(&["--action", "user.disable"]);
    assert_eq!(disabled.len(), 1);
    assert_eq!(
        events(&["--user", "one@example.com", "--action", "user.disable"]).len(),
        0
    );

    let out = keygate(&config, &["audit", "--action", "user.disable"], "");
    let table = text(&out.stdout);
    assert!(table.lines().next().unwrap().starts_with("TIME"), "{table}");
    assert!(table.lines().nth(1).unwrap().contains(" UTC "), "{table}");

    let out = keygate(&config, &["audit", "--since", "yesterday"], "");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("RFC 3339"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn fatal_errors_are_json_when_the_log_is_json() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_only_config(dir.path());
    let out = keygate(&config, &["--log-format", "json", "user", "list"], "");
    assert!(!out.status.success());
    let err = text(&out.stderr);
    let lines: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .collect();
    let fatal = lines.iter().find(|l| l["level"] == "ERROR").expect(&err);
    assert!(
        fatal["fields"]["message"]
            .as_str()
            .unwrap()
            .contains("no store at"),
        "{fatal}"
    );
}

#[test]
fn the_bootstrap_password_never_enters_a_json_log_but_a_private_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().display().to_string();
    let config = dir.path().join("keygate.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndata_dir = \"{data}\"\n[listen]\nhttps = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\n\
             admin = \"127.0.0.1:0\"\n[store]\nurl = \"sqlite://{data}/k.db\"\n[log]\nformat = \"json\"\n"
        ),
    )
    .unwrap();
    let log = dir.path().join("serve.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_keygate"))
        .args(["--config", config.to_str().unwrap(), "serve"])
        .env("RUST_LOG", "info")
        .env_remove("KEYGATE_CONFIG")
        .env_remove("KEYGATE_BOOTSTRAP_PASSWORD")
        .stderr(std::fs::File::create(&log).unwrap())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let file = dir.path().join("bootstrap-admin-password");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap()
        .contains("keygate is serving")
    {
        assert!(
            Instant::now() < deadline,
            "{}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    let password = std::fs::read_to_string(&file).unwrap().trim().to_string();
    assert!(password.len() >= 20, "a generated password");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        !logged.contains(&password),
        "the password is not in the log"
    );
    let said = logged
        .lines()
        .find(|l| l.contains("first administrator"))
        .expect(&logged);
    let said: serde_json::Value = serde_json::from_str(said).unwrap();
    assert_eq!(said["fields"]["file"], file.display().to_string());
    for line in logged.lines() {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|_| panic!("a line that is not JSON: {line}"));
    }
}

/// A self-signed certificate and its key, as PEM files in `dir`.
fn certificate(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["keygate.example".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let cert_path = dir.join(format!("{name}-cert.pem"));
    let key_path = dir.join(format!("{name}-key.pem"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (cert_path, key_path)
}

#[test]
fn check_config_catches_swapped_certificate_files_and_a_key_of_another_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "one");
    let (_, other_key) = certificate(dir.path(), "two");
    let check = |cert: &Path, key: &Path| {
        let config = dir.path().join("tls.toml");
        std::fs::write(
            &config,
            format!(
                "[tls]\ncert = \"{}\"\nkey = \"{}\"\n",
                cert.display(),
                key.display()
            ),
        )
        .unwrap();
        keygate(&config, &["--quiet", "check-config"], "")
    };
    let out = check(&cert, &key);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let out = check(&key, &cert);
    assert_eq!(out.status.code(), Some(64));
    let err = text(&out.stderr);
    assert!(
        err.contains("tls.cert") && err.contains("holds a private key"),
        "{err}"
    );
    assert!(
        err.contains("tls.key") && err.contains("holds a certificate"),
        "{err}"
    );
    assert!(err.contains("swapped"), "{err}");

    let out = check(&cert, &other_key);
    assert_eq!(out.status.code(), Some(64));
    let err = text(&out.stderr);
    assert!(err.contains("does not match the certificate"), "{err}");
}

#[test]
fn check_config_connect_names_a_store_and_a_redis_it_cannot_reach() {
    let dir = tempfile::tempdir().unwrap();
    let closed = || {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let (pg, redis) = (closed(), closed());
    let config = dir.path().join("keygate.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"postgres://kg@127.0.0.1:{pg}/keygate\"\n\
             [redis]\nurl = \"redis://127.0.0.1:{redis}/\"\n"
        ),
    )
    .unwrap();
    let out = keygate(&config, &["--quiet", "check-config"], "");
    assert!(out.status.success(), "without --connect nothing is reached");
    let out = keygate(&config, &["--quiet", "check-config", "--connect"], "");
    assert_eq!(out.status.code(), Some(64));
    let err = text(&out.stderr);
    assert!(err.contains("(2 problems)"), "{err}");
    assert!(
        err.contains(&format!(
            "store.url: cannot reach PostgreSQL at 127.0.0.1:{pg}"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "redis.url: cannot reach redis://127.0.0.1:{redis}/"
        )),
        "{err}"
    );

    let reachable = store_ready_config(dir.path());
    let out = keygate(&reachable, &["--quiet", "check-config", "--connect"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("store reached"), "{stdout}");
    assert!(stdout.contains("Redis not configured"), "{stdout}");
    assert!(!stdout.contains("Redis reached"), "{stdout}");
}

#[test]
fn a_changing_command_prints_its_own_message_without_log_lines() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_ready_config(dir.path());
    let mut child = Command::new(env!("CARGO_BIN_EXE_keygate"))
        .args(["--quiet", "--config", config.to_str().unwrap()])
        .args([
            "user",
            "add",
            "--email",
            "plain@example.com",
            "--authority",
            "SYS_ADMIN",
        ])
        .env_remove("RUST_LOG")
        .env_remove("KEYGATE_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"a-long-password\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "", "no audit or migration log lines");
    assert!(text(&out.stdout).starts_with("created user plain@example.com"));
}
