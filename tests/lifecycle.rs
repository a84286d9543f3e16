//! The real binary's lifecycle: SIGTERM drains in-flight requests and exits 0.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{DocumentUpstream, Process, Upstream, certificate_into, write_config};
use serde_json::json;

#[tokio::test]
async fn sigterm_lets_an_in_flight_request_finish_and_exits_zero() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("keygate.toml");
    let data = dir.path().display();
    std::fs::write(
        &config,
        format!(
            "[server]\ndata_dir = \"{data}\"\nshutdown_grace = \"10s\"\n[listen]\nhttps = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
             [store]\nurl = \"sqlite://{data}/k.db\"\n[[route]]\nprefix = \"/api/noauth/\"\nupstreams = [\"{}\"]\npublic = true\n",
            upstream.url()
        ),
    )
    .unwrap();
    let mut process = Process::spawn(&config, "info");
    let (http, admin) = (process.http, process.admin);

    // Answered by the upstream after 5 s: in flight for all of the checks.
    let slow = tokio::spawn(async move {
        let started = Instant::now();
        let response = reqwest::get(format!("http://127.0.0.1:{http}/api/noauth/slow?ms=5000"))
            .await
            .unwrap();
        (response.status().as_u16(), started.elapsed())
    });
    common::wait_until(
        "the request in flight",
        Duration::from_secs(30),
        async || upstream.arrived() >= 1,
    )
    .await;
    process.signal("TERM");
    common::wait_until(
        "unready while draining",
        Duration::from_secs(30),
        async || {
            let ready = reqwest::get(format!("http://127.0.0.1:{admin}/readyz"))
                .await
                .unwrap();
            ready.status() == 503
        },
    )
    .await;
    common::wait_until(
        "new connections refused",
        Duration::from_secs(30),
        async || {
            reqwest::get(format!("http://127.0.0.1:{http}/api/noauth/fast"))
                .await
                .is_err()
        },
    )
    .await;
    assert!(
        !slow.is_finished(),
        "the in-flight request ended before the drain was checked"
    );

    let (code, took) = slow.await.unwrap();
    assert_eq!(code, 200, "the in-flight request completed");
    assert!(took >= Duration::from_secs(5));
    let deadline = Instant::now() + Duration::from_secs(15);
    let exit = loop {
        if let Some(exit) = process.child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "keygate did not exit after draining"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(exit.code(), Some(0));
}

#[tokio::test]
async fn sighup_reloads_routes_and_certificate_and_refuses_a_broken_config() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let first_ca = certificate_into(&dir.path().join("first"), &data);
    let config = dir.path().join("keygate.toml");
    write_config(&config, &data, &upstream.url(), "");
    let mut process = Process::spawn(&config, "info");
    let (https, http, admin) = (process.https, process.http, process.admin);
    let hup = || process.signal("HUP");
    let status_of = |path: &'static str| async move {
        reqwest::get(format!("http://127.0.0.1:{http}{path}"))
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    let handshake = |client: reqwest::Client| async move {
        client
            .get(format!("https://localhost:{https}/api/noauth/x"))
            .send()
            .await
            .is_ok()
    };
    assert!(handshake(common::client_trusting(&first_ca)).await);
    assert_eq!(status_of("/other/x").await, 404);

    // A new route and a new certificate, applied without a restart.
    write_config(
        &config,
        &data,
        &upstream.url(),
        &format!(
            "[[route]]\nprefix = \"/other/\"\nupstreams = [\"{}\"]\npublic = true\n",
            upstream.url()
        ),
    );
    let second_ca = certificate_into(&dir.path().join("second"), &data);
    hup();
    let deadline = Instant::now() + Duration::from_secs(5);
    while status_of("/other/x").await != 200 {
        assert!(Instant::now() < deadline, "the new route was not applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        handshake(common::client_trusting(&second_ca)).await,
        "new handshakes get the new certificate"
    );

    // A broken config changes nothing.
    std::fs::write(&config, "[[route]]\nprefix = \"no-slash\"\n").unwrap();
    hup();
    let metrics_text = || async move {
        reqwest::get(format!("http://127.0.0.1:{admin}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let refused = r#"keygate_config_reloads_total{outcome="failure",what="routes"} 1"#;
    common::wait_until(
        "the broken config refused",
        Duration::from_secs(30),
        async || metrics_text().await.contains(refused),
    )
    .await;
    assert_eq!(status_of("/other/x").await, 200);
    let metrics = metrics_text().await;
    assert!(
        metrics.contains(r#"keygate_config_reloads_total{outcome="success",what="tls"}"#),
        "{metrics}"
    );

    process.signal("TERM");
    let _ = process.child.wait();
}

/// The API browser follows a reload: a route added with an `openapi`
/// document shows its paths in /v3/api-docs (without waiting for the
/// periodic refresh), and a removed route's paths leave it.
#[tokio::test]
async fn sighup_adds_and_removes_a_routes_document_in_the_api_browser() {
    let upstream = Upstream::start().await;
    let documented = DocumentUpstream::start(json!({
        "openapi": "3.1.0",
        "info": {"title": "devices", "version": "1"},
        "paths": {"/devices/{id}": {"get": {"operationId": "getDevice", "responses": {"200": {"description": "ok"}}}}}
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("keygate.toml");
    let write = |extra_route: &str| {
        let data = dir.path().display();
        std::fs::write(
            &config,
            format!(
                "[server]\ndata_dir = \"{data}\"\n[listen]\nhttps = \"\"\nhttp = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
                 [store]\nurl = \"sqlite://{data}/k.db\"\n[api_browser]\nrefresh = \"1h\"\n\
                 [[route]]\nprefix = \"/api/noauth/\"\nupstreams = [\"{}\"]\npublic = true\n{extra_route}",
                upstream.url()
            ),
        )
        .unwrap();
    };
    write("");
    let mut process = Process::spawn(&config, "info");
    let http = process.http;
    let paths = || async move {
        let doc: serde_json::Value = reqwest::get(format!("http://127.0.0.1:{http}/v3/api-docs"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        doc["paths"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect::<Vec<_>>()
    };
    assert!(paths().await.iter().any(|p| p == "/api/auth/login"));
    assert!(!paths().await.iter().any(|p| p.starts_with("/devices/")));

    write(&format!(
        "[[route]]\nname = \"devices\"\nprefix = \"/devices/\"\nupstreams = [\"{}\"]\nopenapi = \"/v3/api-docs\"\n",
        documented.url()
    ));
    process.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !paths().await.iter().any(|p| p == "/devices/{id}") {
        assert!(
            Instant::now() < deadline,
            "the reloaded route's document did not reach /v3/api-docs"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = reqwest::get(format!("http://127.0.0.1:{http}/devices/7"))
        .await
        .unwrap()
        .status();
    assert_eq!(
        status, 401,
        "the route itself is in force, and authenticated"
    );

    write("");
    process.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while paths().await.iter().any(|p| p.starts_with("/devices/")) {
        assert!(
            Instant::now() < deadline,
            "the removed route's paths stayed in /v3/api-docs"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = reqwest::get(format!("http://127.0.0.1:{http}/devices/7"))
        .await
        .unwrap()
        .status();
    assert_eq!(status, 404, "the route is gone too");
    process.signal("TERM");
    let _ = process.child.wait();
}

/// No credential, password or token reaches the log, even at debug level.
#[tokio::test]
async fn secrets_never_reach_the_log_even_at_debug_level() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().display().to_string();
    let config = dir.path().join("keygate.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndata_dir = \"{data}\"\n[listen]\nhttps = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
             [store]\nurl = \"sqlite://{data}/k.db\"\n[[route]]\nprefix = \"/api/\"\nupstreams = [\"{}\"]\n",
            upstream.url()
        ),
    )
    .unwrap();
    let password = "Secret-Password-For-Log-Test";
    // The server creates the store; the CLI adds a user to it.
    let mut process = Process::spawn(&config, "debug");
    let add = Command::new(env!("CARGO_BIN_EXE_keygate"))
        .arg("--config")
        .arg(&config)
        .args([
            "user",
            "add",
            "--email",
            "logs@example.com",
            "--authority",
            "SYS_ADMIN",
        ])
        .env_remove("KEYGATE_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    use std::io::Write;
    add.stdin
        .as_ref()
        .unwrap()
        .write_all(format!("{password}\n").as_bytes())
        .unwrap();
    assert!(add.wait_with_output().unwrap().status.success());
    let http = process.http;
    let base = format!("http://127.0.0.1:{http}");
    let client = reqwest::Client::new();
    let pair: serde_json::Value = client
        .post(format!("{base}/api/auth/login"))
        .json(&serde_json::json!({"username": "logs@example.com", "password": password}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = pair["token"].as_str().unwrap().to_string();
    let refresh = pair["refreshToken"].as_str().unwrap().to_string();
    let bad_login = client
        .post(format!("{base}/api/auth/login"))
        .json(
            &serde_json::json!({"username": "logs@example.com", "password": "Wrong-Secret-Guess"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(bad_login.status(), 401);
    // People type their password into the name field: it is never logged as typed.
    let typed_as_name = client
        .post(format!("{base}/api/auth/login"))
        .json(&serde_json::json!({"username": "Password-Typed-As-Username", "password": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(typed_as_name.status(), 401);
    for header in [
        format!("Bearer {token}"),
        "ApiKey tb_Leaked-Key-Value".to_string(),
    ] {
        client
            .get(format!("{base}/api/devices"))
            .header("X-Authorization", header)
            .send()
            .await
            .unwrap();
    }
    let _ = client
        .post(format!("{base}/api/auth/token"))
        .json(&serde_json::json!({"refreshToken": refresh}))
        .send()
        .await
        .unwrap();
    process.signal("TERM");
    let _ = process.child.wait();
    let text = std::fs::read_to_string(&process.log).unwrap();
    assert!(text.contains("keygate::access"), "debug logging ran");
    for secret in [
        password,
        "Wrong-Secret-Guess",
        "Password-Typed-As-Username",
        "password-typed-as-username",
        "Leaked-Key-Value",
        &token,
        &refresh,
        "bootstrap-password",
    ] {
        assert!(
            !text.contains(secret),
            "a secret reached the log: {}…",
            &secret[..8]
        );
    }
}

#[tokio::test]
async fn startup_log_says_where_the_api_browser_is() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("keygate.toml");
    write_config(&config, dir.path(), &upstream.url(), "");
    certificate_into(&dir.path().join("ca"), dir.path());
    let mut process = Process::spawn(&config, "info");
    let expected = format!("https://localhost:{}/swagger-ui.html", process.https);
    let deadline = Instant::now() + Duration::from_secs(10);
    let found = loop {
        let text = std::fs::read_to_string(&process.log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains("\"API browser\"")) {
            break line.to_string();
        }
        assert!(Instant::now() < deadline, "no API browser line:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    process.signal("TERM");
    let _ = process.child.wait();
    assert!(found.contains(&expected), "{found}");
}

#[tokio::test]
async fn sighup_names_each_changed_setting_it_cannot_apply() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    certificate_into(&dir.path().join("first"), &data);
    let config = dir.path().join("keygate.toml");
    write_config(&config, &data, &upstream.url(), "");
    let mut process = Process::spawn(&config, "info");
    write_config(
        &config,
        &data,
        &upstream.url(),
        "[quota]\nper_key = \"10/s\"\n[limits]\nmax_body_bytes = 1000\n",
    );
    process.signal("HUP");
    let log = || std::fs::read_to_string(&process.log).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !log().contains("limits.max_body_bytes changed") {
        assert!(Instant::now() < deadline, "no warning:\n{}", log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = log();
    let warned: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("needs a restart"))
        .collect();
    assert_eq!(warned.len(), 2, "{text}");
    assert!(
        text.contains("quota.per_key changed: needs a restart"),
        "{text}"
    );
    assert!(
        !warned.iter().any(|l| l.contains("\"setting\":\"route")),
        "routes reload: {text}"
    );
    process.signal("TERM");
    let _ = process.child.wait();
}

#[tokio::test]
async fn process_exits_promptly_after_logging_stopped() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("keygate.toml");
    write_config(&config, dir.path(), &upstream.url(), "");
    certificate_into(&dir.path().join("ca"), dir.path());
    let mut process = Process::spawn(&config, "info");
    // What a server has done before it stops: a password hash (its threads
    // started), a proxied request (a pooled upstream connection), a refusal.
    let http = process.http;
    let client = reqwest::Client::new();
    let login = client
        .post(format!("http://127.0.0.1:{http}/api/auth/login"))
        .json(&json!({"username": "sysadmin@keygate.local", "password": "bootstrap-password"}))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 200);
    let proxied = client
        .get(format!("http://127.0.0.1:{http}/api/noauth/fast"))
        .send()
        .await
        .unwrap();
    assert_eq!(proxied.status(), 200);
    drop(client);

    process.signal("TERM");
    let deadline = Instant::now() + Duration::from_secs(30);
    let stopped_seen = loop {
        let text = std::fs::read_to_string(&process.log).unwrap_or_default();
        if text.lines().any(|l| l.contains("\"stopped\"")) {
            break Instant::now();
        }
        assert!(Instant::now() < deadline, "no `stopped` line:\n{text}");
        std::thread::sleep(Duration::from_millis(5));
    };
    let exit = loop {
        if let Some(exit) = process.child.try_wait().unwrap() {
            break exit;
        }
        // A bound on a linger, generous for a loaded machine; an exit takes
        // a few milliseconds.
        assert!(
            stopped_seen.elapsed() < Duration::from_secs(1),
            "keygate still running 1 s after logging `stopped`"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(exit.code(), Some(0));
}
