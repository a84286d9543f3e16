//! A small SMTP sink for the mail tests: a loopback TCP server that speaks
//! just enough SMTP to take a message, and keeps each one it took. Test code
//! only; keygate itself sends with `lettre`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// One message as the sink received it.
#[derive(Debug, Clone)]
pub struct Mail {
    pub from: String,
    pub to: Vec<String>,
    pub subject: String,
    /// The body, dot-stuffing undone.
    pub body: String,
}

impl Mail {
    /// The first `http...` word of the body that contains `needle`.
    pub fn link_with(&self, needle: &str) -> String {
        self.body
            .split_whitespace()
            .find(|word| word.starts_with("http") && word.contains(needle))
            .unwrap_or_else(|| panic!("no link with {needle:?} in {}", self.body))
            .to_string()
    }

    /// The first word of six digits in the body.
    pub fn code(&self) -> String {
        self.body
            .split_whitespace()
            .find(|word| word.len() == 6 && word.chars().all(|c| c.is_ascii_digit()))
            .unwrap_or_else(|| panic!("no code in {}", self.body))
            .to_string()
    }
}

pub struct SmtpSink {
    pub addr: SocketAddr,
    mails: Arc<Mutex<Vec<Mail>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SmtpSink {
    pub async fn start() -> SmtpSink {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mails = Arc::new(Mutex::new(Vec::new()));
        let kept = mails.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let kept = kept.clone();
                tokio::spawn(async move {
                    let _ = session(stream, kept).await;
                });
            }
        });
        SmtpSink { addr, mails, task }
    }

    /// The `[mail]` section that sends here.
    pub fn config(&self) -> String {
        format!(
            "[mail]\nhost = \"127.0.0.1\"\nport = {}\ntls = \"none\"\nfrom = \"keygate <noreply@example.com>\"\ntimeout = \"2s\"\nretry_backoff = \"100ms\"\n",
            self.addr.port()
        )
    }

    pub fn mails(&self) -> Vec<Mail> {
        self.mails.lock().unwrap().clone()
    }

    /// Waits for the first message to `to` after the `skip` first ones to
    /// that address.
    pub async fn wait_for(&self, to: &str, skip: usize) -> Mail {
        let started = std::time::Instant::now();
        loop {
            let found: Vec<Mail> = self
                .mails()
                .into_iter()
                .filter(|m| m.to.iter().any(|t| t.eq_ignore_ascii_case(to)))
                .collect();
            if let Some(mail) = found.get(skip) {
                return mail.clone();
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "no mail {skip} to {to} within 10 s; got {:?}",
                self.mails()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How many messages went to `to`.
    pub fn count_to(&self, to: &str) -> usize {
        self.mails()
            .iter()
            .filter(|m| m.to.iter().any(|t| t.eq_ignore_ascii_case(to)))
            .count()
    }
}

fn address(arg: &str) -> String {
    let start = arg.find('<').map_or(0, |i| i + 1);
    let end = arg.find('>').unwrap_or(arg.len());
    arg[start..end].to_string()
}

async fn session(
    stream: tokio::net::TcpStream,
    mails: Arc<Mutex<Vec<Mail>>>,
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    write.write_all(b"220 sink ESMTP ready\r\n").await?;
    let mut from = String::new();
    let mut to = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let command = line.trim_end().to_string();
        let upper = command.to_ascii_uppercase();
        if upper.starts_with("EHLO") || upper.starts_with("HELO") {
            write.write_all(b"250-sink\r\n250 8BITMIME\r\n").await?;
        } else if upper.starts_with("MAIL FROM:") {
            from = address(&command[10..]);
            to.clear();
            write.write_all(b"250 OK\r\n").await?;
        } else if upper.starts_with("RCPT TO:") {
            to.push(address(&command[8..]));
            write.write_all(b"250 OK\r\n").await?;
        } else if upper == "DATA" {
            write.write_all(b"354 go ahead\r\n").await?;
            let mut data = String::new();
            loop {
                line.clear();
                if lines.read_line(&mut line).await? == 0 {
                    return Ok(());
                }
                if line == ".\r\n" || line == ".\n" {
                    break;
                }
                let unstuffed = line.strip_prefix('.').unwrap_or(&line);
                data.push_str(unstuffed);
            }
            let data = data.replace("\r\n", "\n");
            let (head, body) = data.split_once("\n\n").unwrap_or((&data, ""));
            let subject = head
                .lines()
                .find_map(|l| l.strip_prefix("Subject: "))
                .unwrap_or_default()
                .to_string();
            let quoted = head
                .lines()
                .any(|l| l.eq_ignore_ascii_case("Content-Transfer-Encoding: quoted-printable"));
            let body = if quoted {
                quoted_printable(body)
            } else {
                body.to_string()
            };
            mails.lock().unwrap().push(Mail {
                from: from.clone(),
                to: to.clone(),
                subject,
                body,
            });
            write.write_all(b"250 OK queued\r\n").await?;
        } else if upper == "QUIT" {
            write.write_all(b"221 bye\r\n").await?;
            return Ok(());
        } else {
            write.write_all(b"250 OK\r\n").await?;
        }
    }
}

/// Undoes quoted-printable (RFC 2045 6.7): soft line breaks and `=XX`.
fn quoted_printable(text: &str) -> String {
    let joined = text.replace("=\n", "");
    let bytes = joined.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'='
            && i + 2 < bytes.len()
            && let Some(byte) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
