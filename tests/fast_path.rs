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
/// path with `chunked-answer`.
struct Recorder {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Recorder {
    async fn start() -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let record = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_recorded(stream, record.clone()));
            }
        });
        Recorder { addr, seen }
    }

    fn take(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

async fn serve_recorded(mut stream: TcpStream, seen: Arc<Mutex<Vec<Vec<u8>>>>) {
    let mut buf = Vec::new();
    loop {
        let Some(request) = read_request(&mut stream, &mut buf).await else {
            return;
        };
        let chunked = String::from_utf8_lossy(&request).contains("chunked-answer");
        seen.lock().unwrap().push(request);
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
