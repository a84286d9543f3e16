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
