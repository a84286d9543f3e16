//! The lean HTTP/1.1 path against hyper's: every request of a corpus (the
//! smuggling and framing attacks of the security and gateway suites, and
//! generated heads and bodies) goes to a keygate with `proxy.fast_path = true`
//! and to one with it off, both in front of one recording upstream that keeps
//! the exact bytes it receives. The client's answer and the upstream's bytes
//! must be the same (the lean path declines what it does not take, and hyper
//! answers it on either).

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Gateway, counter};
use keygate::identity::Authority;
use proptest::strategy::{Strategy, ValueTree};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A raw upstream: records the bytes of every request (head and body, as
/// framed on the wire) and answers each with a fixed response, chunked for a
/// path with `chunked-answer`. A request for a path with `hold-answer` is
/// never answered: the recorder waits for keygate to close that connection,
/// and counts it in `cancelled`.
struct Recorder {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
    cancelled: Arc<std::sync::atomic::AtomicUsize>,
}

impl Recorder {
    async fn start() -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let cancelled: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let (record, count) = (seen.clone(), cancelled.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_recorded(stream, record.clone(), count.clone()));
            }
        });
        Recorder {
            addr,
            seen,
            cancelled,
        }
    }

    fn cancelled(&self) -> usize {
        self.cancelled.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn take(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

async fn serve_recorded(
    mut stream: TcpStream,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
    cancelled: Arc<std::sync::atomic::AtomicUsize>,
) {
    let mut buf = Vec::new();
    loop {
        let Some(request) = read_request(&mut stream, &mut buf).await else {
            return;
        };
        let text = String::from_utf8_lossy(&request).into_owned();
        let chunked = text.contains("chunked-answer");
        let hold = text.contains("hold-answer");
        seen.lock().unwrap().push(request);
        if text.contains("drop-next") {
            // Answers, then takes the next request on this connection and
            // closes without answering: a keep-alive that ran out just as
            // the request went out.
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n")
                .await;
            let _ = read_request(&mut stream, &mut buf).await;
            return;
        }
        if hold {
            // Bounded: a keygate that never cancels fails the test, not CI.
            let mut rest = [0u8; 64];
            if let Ok(Ok(0) | Err(_)) =
                tokio::time::timeout(Duration::from_secs(30), stream.read(&mut rest)).await
            {
                cancelled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            return;
        }
        // Answers of every framing an upstream may use, named by the path.
        if let Some((_, answer)) = ANSWERS.iter().find(|(name, _)| text.contains(name)) {
            // Close-delimited, HTTP/1.0 or broken answers end the connection.
            let keep = [
                "answer-split",
                "answer-continue",
                "answer-empty",
                "answer-same-length",
            ];
            if stream.write_all(answer).await.is_err() || !keep.iter().any(|k| text.contains(k)) {
                return;
            }
            continue;
        }
        let answer: &[u8] = if chunked {
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nserver: recorder/1\r\n\
              keep-alive: timeout=5\r\ntransfer-encoding: chunked\r\n\r\n\
              5\r\nfirst\r\n6\r\nsecond\r\n0\r\n\r\n"
        } else {
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nserver: recorder/1\r\n\
              connection: keep-alive\r\nx-upstream: yes\r\ncontent-length: 9\r\n\r\nrecorded\n"
        };
        if stream.write_all(answer).await.is_err() {
            return;
        }
    }
}

/// The answers the recorder gives to a path naming them: every framing of
/// RFC 9112 section 6.3 an upstream may use, and malformed ones.
const ANSWERS: &[(&str, &[u8])] = &[
    (
        "answer-split",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n\
          5\r\nhello\r\n0\r\n\r\n",
    ),
    (
        "answer-close",
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end",
    ),
    (
        "answer-ten",
        b"HTTP/1.0 200 OK\r\ncontent-length: 4\r\n\r\nold\n",
    ),
    (
        "answer-continue",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 3\r\n\r\nok\n",
    ),
    ("answer-empty", b"HTTP/1.1 204 No Content\r\nx-a: 1\r\n\r\n"),
    (
        "answer-same-length",
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\nab\n",
    ),
    (
        "answer-two-lengths",
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nab\n",
    ),
    (
        "answer-bad-chunk",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    ),
    ("answer-garbage", b"HTTP/1.1 2x0 OK\r\n\r\n"),
    (
        "answer-truncated",
        b"HTTP/1.1 200 OK\r\ncontent-length: 30\r\n\r\nshort",
    ),
];

/// One whole request (head and its body by its framing) from `stream`, `buf`
/// holding what was read past it.
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let head_len = loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            break i + 4;
        }
        fill(stream, buf).await?;
    };
    let head = String::from_utf8_lossy(&buf[..head_len]).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse::<usize>().unwrap());
    let end = if head.contains("transfer-encoding: chunked") {
        let mut at = head_len;
        loop {
            let line_end = loop {
                if let Some(i) = find(&buf[at..], b"\r\n") {
                    break at + i;
                }
                fill(stream, buf).await?;
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&buf[at..line_end]).ok()?.trim(), 16)
                    .ok()?;
            at = line_end + 2 + size + 2;
            while buf.len() < at {
                fill(stream, buf).await?;
            }
            if size == 0 {
                break at;
            }
        }
    } else {
        let end = head_len + length.unwrap_or(0);
        while buf.len() < end {
            fill(stream, buf).await?;
        }
        end
    };
    Some(buf.drain(..end).collect())
}

async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 4096];
    match stream.read(&mut chunk).await {
        Ok(0) | Err(_) => None,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Some(())
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A keygate in front of the recorder, with one user and key of its own.
struct Side {
    gateway: Gateway,
    key: String,
    /// The values that differ between the two keygates (ids), to be read
    /// as placeholders.
    ids: Vec<(String, &'static str)>,
}

impl Side {
    async fn start(upstream: &str, fast: bool) -> Side {
        let extra = format!(
            "[proxy]\nfast_path = {fast}\n[[route]]\nname = \"chunked\"\nprefix = \"/api/noauth/chunked-answer\"\nupstreams = [\"{upstream}\"]\npublic = true\n"
        );
        let gateway = Gateway::start(upstream, &extra).await;
        let user = gateway
            .user("fast@example.com", Authority::TenantAdmin)
            .await;
        let (key_id, key) = gateway.api_key(&user, 0).await;
        let ids = vec![
            (user.id.to_string(), "<user>"),
            (key_id.to_string(), "<key>"),
            (user.tenant_id.to_string(), "<tenant>"),
        ];
        Side { gateway, key, ids }
    }

    /// Sends `request` (with `{key}` replaced by this side's key) and, after
    /// it, a closing request; returns everything the client read.
    async fn exchange(&self, request: &[u8], tls: bool) -> Vec<u8> {
        let request = replace(request, b"{key}", self.key.as_bytes());
        let mut bytes = request.clone();
        bytes.extend_from_slice(CLOSING);
        if tls {
            let addr = self.gateway.running.https.unwrap();
            let tcp = TcpStream::connect(addr).await.unwrap();
            let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
            let stream = common::tls_connector(&self.gateway.ca_pem)
                .connect(name, tcp)
                .await
                .unwrap();
            talk(stream, &bytes).await
        } else {
            let addr = self.gateway.running.http.unwrap();
            talk(TcpStream::connect(addr).await.unwrap(), &bytes).await
        }
    }

    /// `bytes` with this side's ids, request ids, dates and timestamps read
    /// as placeholders, header lines sorted within each head.
    fn normalise(&self, bytes: &[u8]) -> String {
        let mut text = String::from_utf8_lossy(bytes).into_owned();
        for (id, placeholder) in &self.ids {
            text = text.replace(id.as_str(), placeholder);
        }
        normalise_text(&text)
    }
}

/// Ends every exchange, so that reading to the end of the connection
/// terminates.
const CLOSING: &[u8] = b"GET /api/noauth/closing HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n";

async fn talk<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, bytes: &[u8]) -> Vec<u8> {
    let _ = stream.write_all(bytes).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    out
}

fn replace(haystack: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut i = 0;
    while i < haystack.len() {
        if haystack[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}

/// Request ids, dates and contract timestamps as placeholders; the header
/// lines of each message in sorted order (each stack orders what it adds its
/// own way; the order of a client's own headers is kept, see
/// `client_headers_reach_the_upstream_in_their_order`).
fn normalise_text(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while !rest.is_empty() {
        let Some(end) = rest.find("\r\n\r\n") else {
            out.push_str(&scrub_timestamps(rest));
            break;
        };
        let head = &rest[..end];
        let mut lines = head.split("\r\n");
        out.push_str(lines.next().unwrap_or_default());
        out.push('\n');
        let mut fields: Vec<String> = lines
            .filter(|l| !l.to_ascii_lowercase().starts_with("date:"))
            .map(|l| {
                let lower = l.to_ascii_lowercase();
                if lower.starts_with("x-request-id:") {
                    "x-request-id: <id>".to_string()
                } else {
                    l.to_string()
                }
            })
            .collect();
        fields.sort();
        for field in fields {
            out.push_str(&field);
            out.push('\n');
        }
        rest = &rest[end + 4..];
        // The body: up to the next status line or request line.
        let next = ["HTTP/1.1 ", "GET ", "POST ", "PUT "]
            .iter()
            .filter_map(|start| rest.find(start))
            .min()
            .unwrap_or(rest.len());
        out.push_str("body: ");
        out.push_str(&scrub_timestamps(&rest[..next]));
        out.push('\n');
        rest = &rest[next..];
    }
    out
}

/// The contract's `timestamp` and a record's `createdTime` as placeholders.
fn scrub_timestamps(text: &str) -> String {
    let mut text = text.to_string();
    for key in ["\"timestamp\":", "\"createdTime\":"] {
        let mut out = String::new();
        let mut rest = text.as_str();
        while let Some(i) = rest.find(key) {
            let after = &rest[i + key.len()..];
            out.push_str(&rest[..i + key.len()]);
            out.push_str("<t>");
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            rest = &after[digits..];
        }
        out.push_str(rest);
        text = out;
    }
    text
}

/// The two keygates and their upstream.
struct Pair {
    upstream: Recorder,
    fast: Side,
    hyper: Side,
}

impl Pair {
    async fn start() -> Pair {
        let upstream = Recorder::start().await;
        let url = format!("http://{}", upstream.addr);
        let fast = Side::start(&url, true).await;
        let hyper = Side::start(&url, false).await;
        Pair {
            upstream,
            fast,
            hyper,
        }
    }

    /// Sends `request` to both; the client's answers and the upstream's bytes
    /// must match.
    async fn same(&self, request: &[u8], tls: bool) {
        self.upstream.take();
        let slow_answer = self.hyper.exchange(request, tls).await;
        let slow_upstream = self.upstream.take();
        let fast_answer = self.fast.exchange(request, tls).await;
        let fast_upstream = self.upstream.take();
        let shown = String::from_utf8_lossy(request);
        assert_eq!(
            self.fast.normalise(&fast_answer),
            self.hyper.normalise(&slow_answer),
            "the client's answer differs for {shown:?}"
        );
        let upstream = |side: &Side, seen: &[Vec<u8>]| -> Vec<String> {
            seen.iter().map(|bytes| side.normalise(bytes)).collect()
        };
        assert_eq!(
            upstream(&self.fast, &fast_upstream),
            upstream(&self.hyper, &slow_upstream),
            "the upstream's bytes differ for {shown:?}"
        );
    }
}

/// The framing and smuggling attacks of `tests/security.rs` and
/// `tests/gateway.rs`, and the shapes the lean path takes or declines.
const CORPUS: &[&str] = &[
    // Taken: plain proxied requests, with and without a credential.
    "GET /api/devices?x=1&y=%20 HTTP/1.1\r\nHost: gw\r\nX-Authorization: ApiKey {key}\r\nAccept: */*\r\n\r\n",
    "GET /api/noauth/info HTTP/1.1\r\nHost: gw\r\nUser-Agent: t\r\n\r\n",
    "POST /api/noauth/upload HTTP/1.1\r\nHost: gw\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello",
    "POST /api/devices HTTP/1.1\r\nHost: gw\r\nX-Authorization: ApiKey {key}\r\nContent-Length: 0\r\n\r\n",
    "GET /api/noauth/chunked-answer HTTP/1.1\r\nHost: gw\r\n\r\n",
    // Every framing of the upstream's answer, and malformed answers.
    "GET /api/noauth/answer-close HTTP/1.1\r\nHost: gw\r\n\r\n",
    "GET /api/noauth/answer-ten HTTP/1.1\r\nHost: gw\r\n\r\n",
    "POST /api/noauth/answer-continue HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\nhi",
    "GET /api/noauth/answer-empty HTTP/1.1\r\nHost: gw\r\n\r\n",
    "GET /api/noauth/answer-same-length HTTP/1.1\r\nHost: gw\r\n\r\n",
    "GET /api/noauth/answer-two-lengths HTTP/1.1\r\nHost: gw\r\n\r\n",
    "GET /api/noauth/answer-bad-chunk HTTP/1.1\r\nHost: gw\r\n\r\n",
    "GET /api/noauth/answer-garbage HTTP/1.1\r\nHost: gw\r\n\r\n",
    "GET /api/noauth/answer-split HTTP/1.1\r\nHost: gw\r\n\r\n",
    // Pipelined, keep-alive.
    "GET /api/noauth/a HTTP/1.1\r\nHost: gw\r\n\r\nGET /api/noauth/b HTTP/1.1\r\nHost: gw\r\n\r\n",
    // Identity spoofing and headers a Connection header names away.
    "GET /api/devices HTTP/1.1\r\nHost: gw\r\nX-Authorization: ApiKey {key}\r\nX-Auth-User-Id: evil\r\nx.auth.user-id: evil\r\n\
     Connection: close, X-Auth-User-Id, X-Auth-Tenant-Id, X-Custom\r\nX-Custom: 1\r\n\r\n",
    "GET /api/noauth/x HTTP/1.1\r\nHost: gw\r\nX-Forwarded-For: 1.2.3.4\r\nX-Real-IP: 1.2.3.4\r\nX-Forwarded-Host: evil\r\n\
     x_forwarded_proto: http\r\nForwarded: for=1.2.3.4\r\nVia: 1.1 evil\r\n\r\n",
    "GET /api/noauth/x HTTP/1.1\r\nHost: gw\r\nTE: trailers\r\nKeep-Alive: timeout=1\r\nProxy-Authorization: Basic eA==\r\n\
     Proxy-Connection: keep-alive\r\nTrailer: x\r\n\r\n",
    // Credentials: missing, wrong, repeated, both headers.
    "GET /api/devices HTTP/1.1\r\nHost: gw\r\n\r\n",
    "GET /api/devices HTTP/1.1\r\nHost: gw\r\nX-Authorization: ApiKey tb_wrong\r\n\r\n",
    "GET /api/devices HTTP/1.1\r\nHost: gw\r\nX-Authorization: ApiKey {key}\r\nX-Authorization: ApiKey {key}\r\n\r\n",
    "GET /api/devices HTTP/1.1\r\nHost: gw\r\nAuthorization: ApiKey {key}\r\n\r\n",
    // Paths.
    "GET /api/noauth/../tenant/devices HTTP/1.1\r\nHost: gw\r\n\r\n",
    "GET /api/noauth/..%2ftenant/devices HTTP/1.1\r\nHost: gw\r\n\r\n",
    "GET /api/noauth/..%3B/device/x HTTP/1.1\r\nHost: gw\r\n\r\n",
    "GET /api/noauth/\u{FF0E}\u{FF0E}/tenant/devices HTTP/1.1\r\nHost: gw\r\n\r\n",
    "GET /api/noauth//x/./y HTTP/1.1\r\nHost: gw\r\n\r\n",
    "GET http://gw/api/noauth/absolute HTTP/1.1\r\nHost: gw\r\n\r\n",
    "GET /other HTTP/1.1\r\nHost: gw\r\n\r\n",
    "GET /api/auth/user HTTP/1.1\r\nHost: gw\r\nX-Authorization: ApiKey {key}\r\n\r\n",
    // Framing: smuggling and malformed bodies.
    "POST /api/noauth/upload HTTP/1.1\r\nHost: gw\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n\
     0\r\n\r\nGET /api/noauth/smuggled HTTP/1.1\r\nHost: gw\r\n\r\n",
    "POST /api/noauth/upload HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "POST /api/noauth/upload HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nbroken\r\n0\r\n\r\n",
    "POST /api/noauth/upload HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
    "POST /api/noauth/upload HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    "POST /api/noauth/upload HTTP/1.1\r\nHost: gw\r\nContent-Length: +5\r\n\r\nhello",
    "POST /api/noauth/upload HTTP/1.1\r\nHost: gw\r\nContent-Length: 5, 5\r\n\r\nhello",
    "POST /api/noauth/upload HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    "POST /api/noauth/upload HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello",
    // Names a server folding `_` to `-` reads as framing ones; method overrides.
    "POST /api/noauth/upload HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\nTransfer_Encoding: chunked\r\n\r\nhello",
    "GET /api/noauth/x HTTP/1.1\r\nHost: gw\r\nContent_Length: 5\r\n\r\n",
    "GET /api/noauth/x HTTP/1.1\r\nHost: gw\r\nX-HTTP-Method-Override: DELETE\r\nx_method_override: PUT\r\n\r\n",
    // Versions, upgrades, malformed heads.
    "GET /api/noauth/old HTTP/1.0\r\nHost: gw\r\n\r\n",
    "HEAD /api/noauth/head HTTP/1.1\r\nHost: gw\r\n\r\n",
    "GET /api/noauth/ws HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    "GET /api/noauth/h2c HTTP/1.1\r\nHost: gw\r\nUpgrade: h2c\r\n\r\n",
    "GET /api/noauth/x HTTP/1.1\r\nHost: gw\r\nX-Folded: a\r\n b\r\n\r\n",
    "GET /api/noauth/x HTTP/1.1\r\nHost: gw\r\nBad Name: x\r\n\r\n",
    "GET /api/noauth/x HTTP/1.1\nHost: gw\n\n",
];

#[tokio::test]
async fn every_corpus_request_gets_the_same_answer_and_upstream_bytes_on_both_paths() {
    let pair = Pair::start().await;
    for request in CORPUS {
        pair.same(request.as_bytes(), true).await;
        pair.same(request.as_bytes(), false).await;
    }
    // A head over the size limit.
    let long = format!(
        "GET /api/noauth/x HTTP/1.1\r\nHost: gw\r\nX-Long: {}\r\n\r\n",
        "a".repeat(9000)
    );
    pair.same(long.as_bytes(), false).await;
    // The lean path took the plain requests and left the rest to hyper.
    let metrics = pair.fast.gateway.metrics().await;
    for reason in [
        "transfer_encoding",
        "folded_name",
        "content_length",
        "version",
        "method",
        "upgrade",
        "connection",
        "path",
        "in_clear",
        "malformed",
        "not_proxied",
        "expect",
    ] {
        assert!(
            counter(
                &metrics,
                &format!("keygate_fast_path_declined_total{{reason=\"{reason}\"}}")
            ) > 0,
            "{reason} was never declined:\n{metrics}"
        );
    }
    let metrics = pair.hyper.gateway.metrics().await;
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("keygate_fast_path_declined_total") && !l.ends_with(" 0")),
        "with the lean path off nothing is declined"
    );
}

#[tokio::test]
async fn generated_heads_and_bodies_get_the_same_answer_and_upstream_bytes_on_both_paths() {
    let pair = Pair::start().await;
    let header = proptest::prop_oneof![
        proptest::strategy::Just("Accept: */*".to_string()),
        proptest::strategy::Just("X-Authorization: ApiKey {key}".to_string()),
        proptest::strategy::Just("Connection: keep-alive".to_string()),
        proptest::strategy::Just("Connection: close".to_string()),
        proptest::strategy::Just("Transfer-Encoding: chunked".to_string()),
        proptest::strategy::Just("X-Forwarded-For: 9.9.9.9".to_string()),
        proptest::strategy::Just("X-Auth-User-Id: evil".to_string()),
        proptest::strategy::Just("Keep-Alive: 5".to_string()),
        "[a-zA-Z][a-zA-Z0-9-]{0,12}: [ -~]{0,20}",
    ];
    let strategy = (
        proptest::sample::select(vec!["GET", "POST", "PUT", "DELETE", "PATCH"]),
        proptest::sample::select(vec![
            "/api/noauth/g",
            "/api/devices",
            "/api/noauth/a/../b",
            "/api/noauth/q?x=%41&y",
            "/api/noauth/chunked-answer",
        ]),
        proptest::collection::vec(header, 0..6),
        proptest::collection::vec(proptest::num::u8::ANY, 0..40),
    );
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for case in 0..60 {
        let (method, path, headers, body) = strategy.new_tree(&mut runner).unwrap().current();
        let mut request = format!("{method} {path} HTTP/1.1\r\nHost: gw\r\n").into_bytes();
        let chunked = headers.iter().any(|h| h.starts_with("Transfer-Encoding"));
        for h in &headers {
            request.extend_from_slice(h.as_bytes());
            request.extend_from_slice(b"\r\n");
        }
        if chunked {
            request.extend_from_slice(b"\r\n");
            if !body.is_empty() {
                request.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
                request.extend_from_slice(&body);
                request.extend_from_slice(b"\r\n");
            }
            request.extend_from_slice(b"0\r\n\r\n");
        } else {
            request.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
            request.extend_from_slice(&body);
        }
        pair.same(&request, case % 2 == 0).await;
    }
}

#[tokio::test]
async fn client_headers_reach_the_upstream_in_the_same_order_on_both_paths() {
    let pair = Pair::start().await;
    let request = b"GET /api/noauth/order HTTP/1.1\r\nHost: gw\r\nZ-Last: 1\r\nA-First: 2\r\nM-Middle: 3\r\nA-First: 4\r\n\r\n";
    let mut seen = Vec::new();
    for side in [&pair.fast, &pair.hyper] {
        pair.upstream.take();
        side.exchange(request, true).await;
        let bytes = pair.upstream.take().remove(0);
        let text = String::from_utf8_lossy(&bytes).into_owned();
        // Unsorted: only the request id differs.
        let lines: Vec<String> = text
            .lines()
            .filter(|l| !l.starts_with("x-request-id:"))
            .map(str::to_owned)
            .collect();
        seen.push(lines);
    }
    assert_eq!(seen[0], seen[1]);
    let at = |name: &str| seen[0].iter().position(|l| l == name).unwrap();
    // A header map keeps the first appearance of each name, and a name's
    // values together, in their order.
    assert!(at("z-last: 1") < at("a-first: 2"), "{:?}", seen[0]);
    assert!(at("a-first: 2") < at("a-first: 4"), "{:?}", seen[0]);
    assert!(at("a-first: 4") < at("m-middle: 3"), "{:?}", seen[0]);
}

#[tokio::test]
async fn a_client_that_hangs_up_while_the_upstream_answers_cancels_the_upstream_request_on_both_paths()
 {
    let pair = Pair::start().await;
    for (side, cancelled) in [(&pair.fast, 1), (&pair.hyper, 2)] {
        let request = replace(
            b"GET /api/hold-answer HTTP/1.1\r\nHost: gw\r\nX-Authorization: ApiKey {key}\r\n\r\n",
            b"{key}",
            side.key.as_bytes(),
        );
        let addr = side.gateway.running.https.unwrap();
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let mut stream = common::tls_connector(&side.gateway.ca_pem)
            .connect(name, tcp)
            .await
            .unwrap();
        stream.write_all(&request).await.unwrap();
        common::wait_until(
            "the request reached the upstream",
            Duration::from_secs(10),
            async || !pair.upstream.seen.lock().unwrap().is_empty(),
        )
        .await;
        pair.upstream.take();
        // The client goes away with its request still unanswered.
        drop(stream);
        common::wait_until(
            "keygate closed the upstream connection",
            Duration::from_secs(10),
            async || pair.upstream.cancelled() == cancelled,
        )
        .await;
        let metrics = side.gateway.metrics().await;
        assert_eq!(
            counter(
                &metrics,
                r#"keygate_client_aborts_total{kind="gone",route="api"}"#
            ),
            1,
            "the hang-up counted as the client's: {metrics}"
        );
    }
}

#[tokio::test]
async fn an_upstream_answer_with_both_transfer_encoding_and_content_length_cannot_split_the_clients_response()
 {
    let pair = Pair::start().await;
    for side in [&pair.fast, &pair.hyper] {
        let answer = side
            .exchange(
                b"GET /api/noauth/answer-split HTTP/1.1\r\nHost: gw\r\n\r\n",
                true,
            )
            .await;
        let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
        // The upstream's length (3) would have ended the body inside the
        // chunk and made the rest read as a second response.
        assert!(!text.contains("content-length: 3\r\n"), "{text}");
        assert!(text.contains("hello"), "{text}");
        assert_eq!(
            text.matches("http/1.1 200 ok").count(),
            2,
            "the answer, then the closing request's: {text}"
        );
        assert!(text.ends_with("recorded\n"), "{text}");
    }
}

#[tokio::test]
async fn an_idempotent_request_on_a_pooled_connection_the_upstream_closed_goes_again_once_on_the_lean_path()
 {
    let pair = Pair::start().await;
    let side = &pair.fast;
    for (second, expected) in [
        ("GET /api/noauth/after", "HTTP/1.1 200 OK"),
        ("POST /api/noauth/after", "HTTP/1.1 502 Bad Gateway"),
    ] {
        // One client connection: the first request leaves the upstream
        // connection in the pool, the second finds it closed under it.
        let request = format!(
            "GET /api/noauth/drop-next HTTP/1.1\r\nHost: gw\r\n\r\n{second} HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\n\r\n"
        );
        let answer = side.exchange(request.as_bytes(), true).await;
        let text = String::from_utf8_lossy(&answer).into_owned();
        let answers: Vec<&str> = text
            .match_indices("HTTP/1.1 ")
            .map(|(at, _)| &text[at..at + text[at..].find("\r\n").unwrap()])
            .collect();
        assert_eq!(
            answers,
            ["HTTP/1.1 200 OK", expected, "HTTP/1.1 200 OK"],
            "{second}: {text}"
        );
    }
}

#[tokio::test]
async fn an_upstream_body_cut_short_reaches_the_client_as_a_response_it_can_tell_is_incomplete() {
    let pair = Pair::start().await;
    for side in [&pair.fast, &pair.hyper] {
        let answer = side
            .exchange(
                b"GET /api/noauth/answer-truncated HTTP/1.1\r\nHost: gw\r\n\r\n",
                true,
            )
            .await;
        // hyper's path sends nothing; the lean path has sent the head and
        // the bytes that came, under the upstream's length, and closes.
        // Either way nothing follows that could read as another response.
        let text = String::from_utf8_lossy(&answer).into_owned();
        if !text.is_empty() {
            assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
            assert!(text.contains("content-length: 30\r\n"), "{text}");
            let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
            assert_eq!(body, "short", "{text}");
        }
    }
}
