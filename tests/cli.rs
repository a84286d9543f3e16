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
        &["apikey", "list", "--email", "cli@example.com"],
        "",
    );
    let listing = text(&out.stdout);
    assert!(
        listing.contains("ci") && !listing.contains(&key),
        "{listing}"
    );
    let key_id = listing.split_whitespace().next().unwrap().to_string();

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
    let out = keygate(&config, &["audit", "--limit", "10"], "");
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
    let config = store_only_config(dir.path());
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
    let out = keygate(&config, &["health"], "");
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
