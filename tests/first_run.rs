//! The first hour of a new operator: `keygate serve --dev` shows the whole job
//! in one command, and the messages along the way say what to do.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The keygate binary run in `dir` with `args`, every listener on port 0 and
/// no configuration file but the defaults.
fn serving(dir: &std::path::Path, args: &[&str], rust_log: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keygate"));
    command
        .args(args)
        .current_dir(dir)
        .env("KEYGATE_LISTEN_HTTPS", "127.0.0.1:0")
        .env("KEYGATE_LISTEN_HTTP", "127.0.0.1:0")
        .env("KEYGATE_LISTEN_ADMIN", "127.0.0.1:0")
        .env("RUST_LOG", rust_log)
        .env_remove("KEYGATE_CONFIG");
    command
}

/// A `keygate serve --dev` process in an empty folder, listeners on port 0.
struct Dev {
    child: Child,
    dir: tempfile::TempDir,
    /// Everything it wrote to stderr up to the end of the quick-start text.
    console: String,
}

impl Dev {
    fn start() -> Dev {
        let dir = tempfile::tempdir().unwrap();
        let mut child = serving(dir.path(), &["serve", "--dev"], "warn")
            .env_remove("KEYGATE_BOOTSTRAP_PASSWORD")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let console = stderr_until(&mut child, |line| line.starts_with("Stop with Ctrl-C"));
        Dev {
            child,
            dir,
            console,
        }
    }

    /// The value after `label` on its console line.
    fn field(&self, label: &str) -> String {
        self.console
            .lines()
            .find_map(|l| l.trim_start().strip_prefix(label))
            .unwrap_or_else(|| panic!("{label:?} missing from:\n{}", self.console))
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    }

    fn key(&self) -> String {
        let start = self.console.find("ApiKey ").expect("a curl with a key") + "ApiKey ".len();
        self.console[start..]
            .split('\'')
            .next()
            .unwrap()
            .to_string()
    }

    fn client(&self) -> reqwest::Client {
        let ca = std::fs::read(self.dir.path().join(self.field("trust this CA"))).unwrap();
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
    }
}

/// The child's stderr up to the first line `stop` accepts; panics after 30 s.
fn stderr_until(child: &mut Child, stop: impl Fn(&str) -> bool) -> String {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Drains stderr to the end, also after the test stopped listening:
        // the process keeps a live stderr, as under a real log collector.
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("the expected line never came:\n{seen}"));
        seen.push_str(&line);
        seen.push('\n');
        if stop(&line) {
            return seen;
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn serve_dev_shows_the_whole_job_in_one_command() {
    let dev = Dev::start();
    // The console says what to do next.
    let browser = dev.field("API browser");
    assert!(
        browser.starts_with("https://localhost:") && browser.ends_with("/swagger-ui.html"),
        "{}",
        dev.console
    );
    let base = browser.trim_end_matches("/swagger-ui.html").to_string();
    assert_eq!(dev.field("trust this CA"), "data/dev-ca.pem");
    let password = dev
        .console
        .split("with password: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the bootstrap administrator's password is shown once")
        .to_string();
    let key = dev.key();
    let client = dev.client();

    // The pasted curl goes through to the upstream with the fresh key.
    let created: serde_json::Value = client
        .post(format!("{base}/api/device"))
        .header("X-Authorization", format!("ApiKey {key}"))
        .json(&serde_json::json!({"name": "Thermostat A"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(created["name"], "Thermostat A", "{created}");
    let listed: serde_json::Value = client
        .get(format!("{base}/api/tenant/devices?pageSize=10&page=0"))
        .header("X-Authorization", format!("ApiKey {key}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed["data"][0]["name"], "Thermostat A", "{listed}");

    // The API browser lists keygate's endpoints and the upstream's, joined
    // (the upstream's document is fetched just after start).
    let deadline = Instant::now() + Duration::from_secs(10);
    let doc = loop {
        let doc: serde_json::Value = client
            .get(format!("{base}/v3/api-docs"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if doc["paths"].get("/api/tenant/devices").is_some() || Instant::now() > deadline {
            break doc;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let paths = doc["paths"].as_object().unwrap();
    for path in [
        "/api/auth/login",
        "/api/apiKey",
        "/api/device",
        "/api/tenant/devices",
    ] {
        assert!(
            paths.contains_key(path),
            "{path} missing from the joined document"
        );
    }

    // The bootstrap administrator exists and logs in with the printed password.
    let login = client
        .post(format!("{base}/api/auth/login"))
        .json(&serde_json::json!({"username": "sysadmin@keygate.local", "password": password}))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 200);
}

#[test]
fn serve_dev_refuses_an_explicit_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("keygate.toml");
    std::fs::write(&config, "").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_keygate"))
        .arg("--config")
        .arg(&config)
        .args(["serve", "--dev"])
        .env_remove("KEYGATE_CONFIG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("drop --config"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_taken_port_is_named_once_with_what_to_do() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_keygate"))
        .arg("serve")
        .current_dir(dir.path())
        .env("KEYGATE_LISTEN_HTTPS", "")
        .env("KEYGATE_LISTEN_ADMIN", "")
        .env("KEYGATE_LISTEN_HTTP", addr.to_string())
        .env("RUST_LOG", "error")
        .env_remove("KEYGATE_CONFIG")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(last.contains(&format!("cannot listen on {addr}")), "{err}");
    assert!(last.contains("stop it"), "{err}");
    assert_eq!(
        last.matches("Address already in use").count(),
        1,
        "the cause is named once: {last}"
    );
}

#[test]
fn a_bootstrap_password_for_a_store_with_users_is_reported_not_ignored() {
    let dir = tempfile::tempdir().unwrap();
    // A store made before the first serve (the CLI never creates one), and
    // a user added to it with the CLI.
    let url = format!("sqlite://{}/data/keygate.db", dir.path().display());
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
    let add = Command::new(env!("CARGO_BIN_EXE_keygate"))
        .args([
            "user",
            "add",
            "--email",
            "early@example.com",
            "--authority",
            "SYS_ADMIN",
        ])
        .current_dir(dir.path())
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
        .write_all(b"a-long-password\n")
        .unwrap();
    assert!(add.wait_with_output().unwrap().status.success());
    let mut serve = serving(dir.path(), &["serve"], "warn")
        .env("KEYGATE_BOOTSTRAP_PASSWORD", "change-me-now")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let seen = stderr_until(&mut serve, |line| {
        line.contains("KEYGATE_BOOTSTRAP_PASSWORD")
    });
    let _ = serve.kill();
    let _ = serve.wait();
    assert!(
        seen.contains("KEYGATE_BOOTSTRAP_PASSWORD is set but the store already has users"),
        "{seen}"
    );
}

#[tokio::test]
async fn a_closed_stderr_never_takes_the_gateway_down() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = serving(dir.path(), &["serve", "--dev"], "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut console = String::new();
    {
        // Read up to the quick-start text, then close the pipe: every log
        // line after this fails to write, as when a log collector goes away.
        let mut reader = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap() > 0 {
            console.push_str(&line);
            if line.starts_with("Stop with Ctrl-C") {
                break;
            }
            line.clear();
        }
    }
    let dev = Dev {
        child,
        dir,
        console,
    };
    let browser = dev.field("API browser");
    let base = browser.trim_end_matches("/swagger-ui.html").to_string();
    let client = dev.client();
    for n in 0..5 {
        let response = client
            .post(format!("{base}/api/device"))
            .header("X-Authorization", format!("ApiKey {}", dev.key()))
            .json(&serde_json::json!({"name": format!("Device {n}")}))
            .send()
            .await
            .expect("the gateway still answers, its access line unwritable");
        assert_eq!(response.status(), 200);
    }
}
