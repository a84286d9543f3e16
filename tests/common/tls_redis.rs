//! A Redis server of the test's own on loopback that speaks only TLS
//! (`--port 0 --tls-port P`), its certificate signed by a generated CA and
//! a password required; stopped by its PID when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The password the server requires: never to be seen in a message.
pub const PASSWORD: &str = "secret-pw";

pub struct TlsRedis {
    pub port: u16,
    /// The CA that signed the server's certificate (for `127.0.0.1`).
    pub ca: PathBuf,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

/// Whether `redis-server` runs here.
fn installed() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

impl TlsRedis {
    /// Starts the server; `None` (the test skipped) when `redis-server` is
    /// not installed.
    pub fn start() -> Option<TlsRedis> {
        if !installed() {
            super::skipped_without("redis-server", "a TLS Redis test");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        keygate::tls::load_or_generate_dev(&certs).unwrap();
        let (ca, cert, key) = keygate::tls::dev_paths(&certs);
        let port = super::free_port();
        let child = Command::new("redis-server")
            .args(["--port", "0", "--bind", "127.0.0.1"])
            .args(["--tls-port", &port.to_string()])
            .arg("--tls-cert-file")
            .arg(&cert)
            .arg("--tls-key-file")
            .arg(&key)
            .arg("--tls-ca-cert-file")
            .arg(&ca)
            .args(["--tls-auth-clients", "no"])
            .args(["--requirepass", PASSWORD])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(dir.path().join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = TlsRedis {
            port,
            ca,
            child: Some(child),
            dir,
        };
        server.wait_listening();
        Some(server)
    }

    /// Until the TLS port accepts connections (within 10 s).
    fn wait_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            let log = std::fs::read_to_string(self.dir.path().join("redis.log"));
            assert!(
                Instant::now() < deadline,
                "redis-server not listening on {} within 10 s: {}",
                self.port,
                log.unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `rediss://` to this server with its password.
    pub fn url(&self) -> String {
        format!("rediss://:{PASSWORD}@127.0.0.1:{}/", self.port)
    }

    /// `redis://` (no TLS) to the same TLS-only port.
    pub fn plain_url(&self) -> String {
        format!("redis://:{PASSWORD}@127.0.0.1:{}/", self.port)
    }

    /// A client of the test's own, trusting the server's CA.
    pub fn client(&self) -> redis::Client {
        let certificates = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(std::fs::read(&self.ca).unwrap()),
        };
        redis::Client::build_with_tls(self.url(), certificates).unwrap()
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
