//! The real binary's lifecycle: SIGTERM drains in-flight requests and exits 0.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Upstream;

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
    let mut child = Command::new(env!("CARGO_BIN_EXE_keygate"))
        .args(["--log-format", "json", "--config"])
        .arg(&config)
        .arg("serve")
        .env("KEYGATE_BOOTSTRAP_PASSWORD", "bootstrap-password")
        .env("RUST_LOG", "info")
        .env_remove("KEYGATE_CONFIG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let serving = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|line| line.contains("keygate is serving"))
        .expect("keygate started");
    let port = |name: &str| -> u16 {
        let json: serde_json::Value = serde_json::from_str(&serving).unwrap();
        let text = json["fields"][name].as_str().unwrap().to_string();
        text.trim_start_matches("Some(127.0.0.1:")
            .trim_end_matches(')')
            .parse()
            .unwrap()
    };
    let (http, admin) = (port("http"), port("admin"));
    std::thread::spawn(move || lines.for_each(drop));

    let slow = tokio::spawn(async move {
        let started = Instant::now();
        let response = reqwest::get(format!("http://127.0.0.1:{http}/api/noauth/slow"))
            .await
            .unwrap();
        (response.status().as_u16(), started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ready = reqwest::get(format!("http://127.0.0.1:{admin}/readyz"))
        .await
        .unwrap();
    assert_eq!(ready.status(), 503, "unready while draining");
    assert!(
        reqwest::get(format!("http://127.0.0.1:{http}/api/noauth/fast"))
            .await
            .is_err(),
        "no new connections are accepted while draining"
    );

    let (code, took) = slow.await.unwrap();
    assert_eq!(code, 200, "the in-flight request completed");
    assert!(took >= Duration::from_secs(2));
    let deadline = Instant::now() + Duration::from_secs(15);
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
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

fn write_config(path: &std::path::Path, data: &std::path::Path, upstream: &str, extra_route: &str) {
    let data = data.display();
    std::fs::write(
        path,
        format!(
            "[server]\ndata_dir = \"{data}\"\n[listen]\nhttps = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
             [tls]\ncert = \"{data}/served-cert.pem\"\nkey = \"{data}/served-key.pem\"\n\
             [store]\nurl = \"sqlite://{data}/k.db\"\n[[route]]\nprefix = \"/api/noauth/\"\nupstreams = [\"{upstream}\"]\npublic = true\n{extra_route}"
        ),
    )
    .unwrap();
}

/// Generates a development CA and certificate in `dir`; returns the CA PEM.
fn certificate_into(dir: &std::path::Path, data: &std::path::Path) -> Vec<u8> {
    keygate::tls::load_or_generate_dev(dir).unwrap();
    let (ca, cert, key) = keygate::tls::dev_paths(dir);
    std::fs::copy(cert, data.join("served-cert.pem")).unwrap();
    std::fs::copy(key, data.join("served-key.pem")).unwrap();
    std::fs::read(ca).unwrap()
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_keygate"))
        .args(["--log-format", "json", "--config"])
        .arg(&config)
        .arg("serve")
        .env("KEYGATE_BOOTSTRAP_PASSWORD", "bootstrap-password")
        .env("RUST_LOG", "info")
        .env_remove("KEYGATE_CONFIG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let serving = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|line| line.contains("keygate is serving"))
        .expect("keygate started");
    std::thread::spawn(move || lines.for_each(drop));
    let json: serde_json::Value = serde_json::from_str(&serving).unwrap();
    let port = |name: &str| -> u16 {
        let text = json["fields"][name].as_str().unwrap();
        text.trim_start_matches("Some(127.0.0.1:")
            .trim_end_matches(')')
            .parse()
            .unwrap()
    };
    let (https, http, admin) = (port("https"), port("http"), port("admin"));
    let hup = || {
        let status = Command::new("kill")
            .args(["-HUP", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    };
    let status_of = |path: &'static str| async move {
        reqwest::get(format!("http://127.0.0.1:{http}{path}"))
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    let trusting = |ca: &[u8]| {
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(ca).unwrap())
            .build()
            .unwrap()
    };
    let handshake = |client: reqwest::Client| async move {
        client
            .get(format!("https://localhost:{https}/api/noauth/x"))
            .send()
            .await
            .is_ok()
    };
    assert!(handshake(trusting(&first_ca)).await);
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
        handshake(trusting(&second_ca)).await,
        "new handshakes get the new certificate"
    );

    // A broken config changes nothing.
    std::fs::write(&config, "[[route]]\nprefix = \"no-slash\"\n").unwrap();
    hup();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(status_of("/other/x").await, 200);
    let metrics = reqwest::get(format!("http://127.0.0.1:{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"keygate_config_reloads_total{outcome="failure",what="routes"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"keygate_config_reloads_total{outcome="success",what="tls"}"#),
        "{metrics}"
    );

    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
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
    let log_path = dir.path().join("keygate.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_keygate"))
        .args(["--log-format", "json", "--config"])
        .arg(&config)
        .arg("serve")
        .env("KEYGATE_BOOTSTRAP_PASSWORD", "bootstrap-password")
        .env("RUST_LOG", "debug")
        .env_remove("KEYGATE_CONFIG")
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let http = loop {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains("keygate is serving")) {
            let json: serde_json::Value = serde_json::from_str(line).unwrap();
            let port: u16 = json["fields"]["http"]
                .as_str()
                .unwrap()
                .trim_start_matches("Some(127.0.0.1:")
                .trim_end_matches(')')
                .parse()
                .unwrap();
            break port;
        }
        assert!(Instant::now() < deadline, "keygate did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
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
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log_path).unwrap();
    assert!(text.contains("keygate::access"), "debug logging ran");
    for secret in [
        password,
        "Wrong-Secret-Guess",
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
