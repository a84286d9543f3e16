//! A PgBouncer of the test's own on loopback in transaction mode, in front
//! of a PostgreSQL server (the test database's), every database name passed
//! through (`* =`); stopped by its PID when dropped.
//!
//! It imports nothing of the harness: the store's own tests include this
//! file too (`src/store/tests.rs`), to run the store suite through it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub struct PgBouncer {
    pub port: u16,
    pid: Option<u32>,
    dir: tempfile::TempDir,
}

/// The installed `pgbouncer` (Debian puts it in `/usr/sbin`); `None` when
/// there is none.
pub fn binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("pgbouncer"))
        .find(|candidate| candidate.is_file())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// What keygate needs of PgBouncer in transaction mode: sqlx sends
/// `extra_float_digits` at startup, which PgBouncer does not track.
fn config(dir: &Path, port: u16, upstream_host: &str, upstream_port: u16) -> String {
    let dir = dir.display();
    format!(
        "[databases]\n\
         * = host={upstream_host} port={upstream_port}\n\
         [pgbouncer]\n\
         listen_addr = 127.0.0.1\n\
         listen_port = {port}\n\
         unix_socket_dir =\n\
         auth_type = trust\n\
         auth_file = {dir}/users.txt\n\
         pool_mode = transaction\n\
         default_pool_size = 4\n\
         max_client_conn = 200\n\
         ignore_startup_parameters = extra_float_digits\n\
         server_reset_query =\n\
         logfile = {dir}/pgbouncer.log\n\
         pidfile = {dir}/pgbouncer.pid\n"
    )
}

impl PgBouncer {
    /// Starts PgBouncer before the PostgreSQL at `upstream_host:upstream_port`
    /// (trust authentication, user `postgres`); `None` when PgBouncer is not
    /// installed (the caller says the test is skipped).
    pub fn start(upstream_host: &str, upstream_port: u16) -> Option<PgBouncer> {
        let binary = binary()?;
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let ini = dir.path().join("pgbouncer.ini");
        std::fs::write(&ini, config(dir.path(), port, upstream_host, upstream_port)).unwrap();
        std::fs::write(dir.path().join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        let mut command = Command::new(binary);
        command.arg("-d");
        // PgBouncer refuses to run as root: it runs as the PostgreSQL user.
        if rustix::process::geteuid().is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(status.success());
            command.args(["-u", "postgres"]);
        }
        let out = command.arg(&ini).output().unwrap();
        let log = || std::fs::read_to_string(dir.path().join("pgbouncer.log")).unwrap_or_default();
        assert!(out.status.success(), "pgbouncer: {}", log());
        let pid_file = dir.path().join("pgbouncer.pid");
        let deadline = Instant::now() + Duration::from_secs(10);
        let pid = loop {
            let pid = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|text| text.trim().parse().ok());
            if pid.is_some() && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break pid;
            }
            assert!(
                Instant::now() < deadline,
                "pgbouncer did not start: {}",
                log()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Some(PgBouncer { port, pid, dir })
    }

    /// Starts PgBouncer before the PostgreSQL a `postgres://` URL names.
    pub fn before(url: &str) -> Option<PgBouncer> {
        let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
        let authority = rest.split(['/', '?']).next().unwrap_or_default();
        let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
        let (host, port) = match host_port.rsplit_once(':') {
            Some((host, port)) => (host, port.parse().unwrap()),
            None => (host_port, 5432),
        };
        PgBouncer::start(host, port)
    }

    /// A URL for `database` through this PgBouncer.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// PgBouncer's log, for a failing test's message.
    #[allow(dead_code)]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let Some(pid) = self.pid.take() else { return };
        // SIGTERM: PgBouncer closes its connections and exits at once.
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
