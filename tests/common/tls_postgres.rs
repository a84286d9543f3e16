//! A PostgreSQL server of the test's own on loopback that accepts only TLS
//! connections (`hostssl` in pg_hba.conf), its certificate signed by a
//! generated CA; stopped by its PID when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub struct TlsPostgres {
    pub port: u16,
    /// The CA that signed the server's certificate (for `127.0.0.1`).
    pub ca: PathBuf,
    pid: Option<u32>,
    _dir: tempfile::TempDir,
}

/// `initdb` of the newest installed PostgreSQL; `None` when there is none.
fn bin(tool: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|entry| entry.path().join("bin").join(tool))
        .filter(|path| path.is_file())
        .collect();
    found.sort();
    found.pop()
}

/// Runs `program` as the PostgreSQL user when this process is root (the
/// server refuses to run as root).
fn as_server_user(program: &Path) -> Command {
    if rustix::process::geteuid().is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

impl TlsPostgres {
    /// Starts the server; `None` (the test skipped) when PostgreSQL's
    /// server programs are not installed.
    pub fn start() -> Option<TlsPostgres> {
        let (Some(initdb), Some(pg_ctl)) = (bin("initdb"), bin("pg_ctl")) else {
            super::skipped_without("PostgreSQL's initdb", "a TLS PostgreSQL test");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        keygate::tls::load_or_generate_dev(&certs).unwrap();
        let (ca, cert, key) = keygate::tls::dev_paths(&certs);
        let data = dir.path().join("data");
        if rustix::process::geteuid().is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(status.success());
        }
        let out = as_server_user(&initdb)
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = super::free_port();
        let settings = format!(
            "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\nfsync = off\n",
            dir.path().display(),
            cert.display(),
            key.display()
        );
        append(&data.join("postgresql.conf"), &settings);
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
        )
        .unwrap();
        let out = as_server_user(&pg_ctl)
            .args(["-w", "-t", "30", "-l"])
            .arg(dir.path().join("server.log"))
            .arg("-D")
            .arg(&data)
            .arg("start")
            .output()
            .unwrap();
        let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
        assert!(out.status.success(), "pg_ctl start: {log}");
        let pid = std::fs::read_to_string(data.join("postmaster.pid"))
            .ok()
            .and_then(|text| text.lines().next()?.trim().parse().ok());
        assert!(pid.is_some(), "no postmaster.pid: {log}");
        Some(TlsPostgres {
            port,
            ca,
            pid,
            _dir: dir,
        })
    }

    /// A URL for this server's `postgres` database with `query`
    /// (`sslmode=...`), carrying a password that must never be shown.
    pub fn url(&self, query: &str) -> String {
        format!(
            "postgres://postgres:secret-pw@127.0.0.1:{}/postgres?{query}",
            self.port
        )
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        let Some(pid) = self.pid.take() else { return };
        // A fast shutdown: gone within seconds; the directory goes after.
        super::stop_pid(pid, "INT", Duration::from_secs(15));
    }
}
