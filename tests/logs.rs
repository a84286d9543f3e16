//! The log of the real binary as an operator reads it in a file: plain text
//! (no colour codes, no Rust Debug text) and access lines without noise.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Process, Upstream};

/// Stops the server when the test ends, passed or failed.
struct Server(Process);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.child.kill();
        let _ = self.0.child.wait();
    }
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// Serves `/api/noauth/` from a live upstream and `/down/` from an address
/// nobody listens on, sends one request of each kind (plain, traced, failed
/// upstream, unrouted) and returns the log text once all four access lines
/// are in it, with the failed upstream's URL.
async fn log_of_four_requests(dir: &Path, format: &str) -> (String, String) {
    let upstream = Upstream::start().await;
    let down = {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", closed.local_addr().unwrap())
    };
    let data = dir.display();
    let config = dir.join("keygate.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndata_dir = \"{data}\"\n[listen]\nhttps = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
             [store]\nurl = \"sqlite://{data}/k.db\"\n\
             [[route]]\nname = \"live\"\nprefix = \"/api/noauth/\"\nupstreams = [\"{}\"]\npublic = true\n\
             [[route]]\nname = \"down\"\nprefix = \"/down/\"\nupstreams = [\"{down}\"]\npublic = true\n",
            upstream.url()
        ),
    )
    .unwrap();
    let server = Server(Process::spawn_logging(&config, "info", format));
    let http = server.0.http;
    assert_ne!(http, 0, "the startup line names the plain HTTP listener");
    let client = reqwest::Client::new();
    let get = |path: &str| client.get(format!("http://127.0.0.1:{http}{path}"));
    assert_eq!(get("/api/noauth/plain").send().await.unwrap().status(), 200);
    let traced = get("/api/noauth/traced")
        .header("traceparent", format!("00-{TRACE_ID}-00f067aa0ba902b7-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(traced.status(), 200);
    assert_eq!(get("/down/x").send().await.unwrap().status(), 502);
    assert_eq!(get("/nowhere").send().await.unwrap().status(), 404);

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&server.0.log).unwrap();
        if text
            .lines()
            .filter(|l| l.contains("keygate::access"))
            .count()
            >= 4
        {
            return (text, down);
        }
        assert!(
            Instant::now() < deadline,
            "four access lines expected:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The digits after the decimal point of a number that starts `text`.
fn decimals(text: &str) -> usize {
    let number: String = text
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == '-' || *c == 'e')
        .collect();
    assert!(!number.is_empty() && !number.contains('e'), "{text}");
    number.split_once('.').map_or(0, |(_, d)| d.len())
}

fn assert_plain_text(text: &str) {
    assert!(
        !text.contains('\u{1b}'),
        "colour escape codes in a log file:\n{text}"
    );
    assert!(
        !text.contains("Some("),
        "Rust Debug text in the log:\n{text}"
    );
}

/// Fields that are left out, never written empty, when a request has none.
const OPTIONAL: [&str; 5] = ["trace_id", "upstream", "auth", "user_id", "key_id"];

#[tokio::test]
async fn json_log_file_is_plain_and_access_lines_carry_no_empty_fields() {
    let dir = tempfile::tempdir().unwrap();
    let (text, down) = log_of_four_requests(dir.path(), "json").await;
    assert_plain_text(&text);
    let serving = text
        .lines()
        .find(|l| l.contains("keygate is serving"))
        .unwrap();
    let serving: serde_json::Value = serde_json::from_str(serving).unwrap();
    for listener in ["https", "http", "admin"] {
        let address = serving["fields"][listener].as_str().unwrap_or_default();
        assert!(
            address.parse::<std::net::SocketAddr>().is_ok(),
            "{listener} is a plain address: {serving}"
        );
    }

    let access: Vec<(&str, serde_json::Value)> = text
        .lines()
        .filter(|l| l.contains("keygate::access"))
        .map(|l| (l, serde_json::from_str::<serde_json::Value>(l).unwrap()))
        .collect();
    assert_eq!(access.len(), 4, "{text}");
    for (line, json) in &access {
        let fields = &json["fields"];
        let duration = line.split("\"duration_ms\":").nth(1).expect(line);
        assert!(
            decimals(duration) <= 3,
            "duration_ms beyond microseconds: {line}"
        );
        assert!(fields["duration_ms"].is_number(), "{line}");
        for name in OPTIONAL {
            assert!(
                fields.get(name).is_none_or(|v| v.as_str() != Some("")),
                "empty {name} written: {line}"
            );
        }
    }
    let by_path = |path: &str| {
        &access
            .iter()
            .find(|(_, j)| j["fields"]["path"] == path)
            .unwrap_or_else(|| panic!("no access line for {path}:\n{text}"))
            .1["fields"]
    };
    assert_eq!(by_path("/down/x")["status"], 502);
    assert_eq!(
        by_path("/down/x")["upstream"],
        down,
        "the failed upstream is named"
    );
    assert_eq!(by_path("/api/noauth/traced")["trace_id"], TRACE_ID);
    assert!(by_path("/api/noauth/plain").get("trace_id").is_none());
    assert!(by_path("/nowhere").get("upstream").is_none());
}

#[tokio::test]
async fn human_log_file_is_plain_and_names_the_upstream_of_a_502() {
    let dir = tempfile::tempdir().unwrap();
    let (text, down) = log_of_four_requests(dir.path(), "human").await;
    assert_plain_text(&text);
    let access: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("keygate::access"))
        .collect();
    assert_eq!(access.len(), 4, "{text}");
    for line in &access {
        let duration = line.split("duration_ms=").nth(1).expect(line);
        assert!(
            decimals(duration) <= 3,
            "duration_ms beyond microseconds: {line}"
        );
        for name in OPTIONAL {
            assert!(
                !line.contains(&format!(" {name}=\"\"")),
                "empty {name} written: {line}"
            );
        }
    }
    let failed = access
        .iter()
        .find(|l| l.contains("status=502"))
        .expect("a 502 access line");
    assert!(
        failed.contains(&format!("upstream=\"{down}\""))
            || failed.contains(&format!("upstream={down}")),
        "the failed upstream is named: {failed}"
    );
}

/// `keygate` with `args` against `config`; its standard output.
fn cli(config: &Path, args: &[&str]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_keygate"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("KEYGATE_CONFIG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"a-long-password\n").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn a_refused_credential_is_logged_with_its_reason_and_owner_never_its_value() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().display();
    let config = dir.path().join("keygate.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndata_dir = \"{data}\"\n[listen]\nhttps = \"127.0.0.1:0\"\nhttp = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\
             [store]\nurl = \"sqlite://{data}/k.db\"\n\
             [[route]]\nname = \"api\"\nprefix = \"/api/\"\nupstreams = [\"{}\"]\n",
            upstream.url()
        ),
    )
    .unwrap();
    let server = Server(Process::spawn(&config, "info"));
    let tenant = "5f1c0c9e-1d2a-4c3b-9e8f-0a1b2c3d4e5f";
    cli(
        &config,
        &[
            "user",
            "add",
            "--email",
            "logged@example.com",
            "--authority",
            "TENANT_ADMIN",
            "--tenant-id",
            tenant,
        ],
    );
    let key = cli(
        &config,
        &["apikey", "create", "--email", "logged@example.com"],
    )
    .trim()
    .to_string();
    let keys: serde_json::Value = serde_json::from_str(&cli(
        &config,
        &["apikey", "list", "--email", "logged@example.com", "--json"],
    ))
    .unwrap();
    let key_id = keys[0]["id"].as_str().unwrap().to_string();
    cli(&config, &["apikey", "disable", &key_id]);

    let ca = std::fs::read(dir.path().join("dev-ca.pem")).unwrap();
    let client = common::client_trusting(&ca);
    let https = server.0.https;
    let call = |path: &str, key: &str| {
        client
            .get(format!("https://localhost:{https}{path}"))
            .header("X-Authorization", common::api_key_header(key))
            .send()
    };
    let unknown = format!("tb_{}", "Zz09".repeat(21));
    assert_eq!(call("/api/disabled", &key).await.unwrap().status(), 401);
    assert_eq!(call("/api/unknown", &unknown).await.unwrap().status(), 401);

    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = std::fs::read_to_string(&server.0.log).unwrap();
        if text
            .lines()
            .filter(|l| l.contains("keygate::access"))
            .count()
            >= 2
        {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "two access lines expected:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        !text.contains(&key) && !text.contains(&unknown),
        "a key in the log"
    );
    let line = |path: &str| -> serde_json::Value {
        let line = text
            .lines()
            .filter(|l| l.contains("keygate::access"))
            .find(|l| l.contains(path))
            .unwrap_or_else(|| panic!("no line for {path}:\n{text}"));
        serde_json::from_str::<serde_json::Value>(line).unwrap()["fields"].clone()
    };
    let disabled = line("/api/disabled");
    assert_eq!(disabled["status"], 401);
    assert_eq!(disabled["refused"], "disabled");
    assert_eq!(disabled["key_id"], key_id.as_str());
    assert!(disabled["user_id"].is_string(), "{disabled}");
    let unknown = line("/api/unknown");
    assert_eq!(unknown["refused"], "unknown");
    assert!(unknown.get("key_id").is_none(), "{unknown}");
}
