//! The small HTTP client single sign-on talks to a provider with: one
//! request per connection, HTTPS with rustls (the provider's `ca_file`
//! besides the system's roots, [`crate::tls_client::ClientTls`]), `http://`
//! only to a loopback host, every exchange under one deadline and every
//! answer under a size cap. Messages name the URL and what went wrong,
//! never a request's body (the token request carries the client secret).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::config::is_loopback_host;

/// Longest a provider may take for one exchange, connect to last byte.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Largest answer read: discovery documents and key sets are a few KiB.
pub const MAX_BODY: usize = 256 * 1024;

/// A provider's answer: its status and its body, whole.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
}

/// Why an exchange with a provider failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{url}: {reason}")]
pub struct FetchError {
    pub url: String,
    pub reason: String,
}

/// Talks to one provider.
#[derive(Clone)]
pub struct Client {
    tls: Arc<rustls::ClientConfig>,
    timeout: Duration,
    max_body: usize,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("timeout", &self.timeout)
            .field("max_body", &self.max_body)
            .finish_non_exhaustive()
    }
}

/// A request to send: its method, URL, and for a POST a form body and an
/// `Authorization` value.
pub struct Outgoing<'a> {
    pub method: Method,
    pub url: &'a str,
    pub form: Option<String>,
    pub authorization: Option<String>,
}

impl Client {
    pub fn new(tls: rustls::ClientConfig) -> Client {
        Client {
            tls: Arc::new(tls),
            timeout: TIMEOUT,
            max_body: MAX_BODY,
        }
    }

    /// `GET url`, expecting a 200.
    pub async fn get(&self, url: &str) -> Result<Bytes, FetchError> {
        let answer = self
            .send(Outgoing {
                method: Method::GET,
                url,
                form: None,
                authorization: None,
            })
            .await?;
        if answer.status != StatusCode::OK {
            return Err(error(url, format!("answered {}", answer.status)));
        }
        Ok(answer.body)
    }

    /// Sends `outgoing` and reads the answer, within the deadline.
    pub async fn send(&self, outgoing: Outgoing<'_>) -> Result<Answer, FetchError> {
        let url = outgoing.url;
        match tokio::time::timeout(self.timeout, self.exchange(outgoing)).await {
            Ok(answer) => answer,
            Err(_) => Err(error(
                url,
                format!("no answer within {}s", self.timeout.as_secs()),
            )),
        }
    }

    async fn exchange(&self, outgoing: Outgoing<'_>) -> Result<Answer, FetchError> {
        let url = outgoing.url;
        let target = Target::of(url)?;
        let tcp = TcpStream::connect((target.host.as_str(), target.port))
            .await
            .map_err(|e| error(url, format!("cannot connect: {e}")))?;
        let _ = tcp.set_nodelay(true);
        let request = target.request(outgoing)?;
        if target.https {
            let name = rustls::pki_types::ServerName::try_from(target.host.clone())
                .map_err(|e| error(url, format!("not a server name: {e}")))?;
            let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
                .connect(name, tcp)
                .await
                .map_err(|e| error(url, format!("TLS: {e}")))?;
            self.over(url, tls, request).await
        } else {
            self.over(url, tcp, request).await
        }
    }

    async fn over<S>(
        &self,
        url: &str,
        stream: S,
        request: Request<Full<Bytes>>,
    ) -> Result<Answer, FetchError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| error(url, format!("HTTP: {e}")))?;
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        let answered = async {
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| error(url, format!("HTTP: {e}")))?;
            let status = response.status();
            let body = read_capped(url, response.into_body(), self.max_body).await?;
            Ok(Answer { status, body })
        }
        .await;
        driver.abort();
        answered
    }
}

/// The body, whole, or an error past `cap` bytes.
async fn read_capped(
    url: &str,
    body: hyper::body::Incoming,
    cap: usize,
) -> Result<Bytes, FetchError> {
    let mut body = body;
    let mut collected = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| error(url, format!("reading the answer: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if collected.len() + data.len() > cap {
                return Err(error(url, format!("answer larger than {cap} bytes")));
            }
            collected.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(collected))
}

/// Where a URL points: `https://`, or `http://` to a loopback host.
#[derive(Debug)]
struct Target {
    https: bool,
    host: String,
    port: u16,
    authority: String,
    path_and_query: String,
}

impl Target {
    fn of(url: &str) -> Result<Target, FetchError> {
        let uri: Uri = url
            .parse()
            .map_err(|e| error(url, format!("not a URL: {e}")))?;
        let authority = uri
            .authority()
            .ok_or_else(|| error(url, "no host".into()))?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") if is_loopback_host(&host) => false,
            Some("http") => {
                return Err(error(
                    url,
                    "http:// is allowed only for a loopback host".into(),
                ));
            }
            _ => return Err(error(url, "not an https:// URL".into())),
        };
        if authority.as_str().contains('@') {
            return Err(error(url, "a user name or password in the URL".into()));
        }
        Ok(Target {
            https,
            port: authority.port_u16().unwrap_or(if https { 443 } else { 80 }),
            authority: authority.as_str().to_owned(),
            path_and_query: uri
                .path_and_query()
                .map_or("/".to_owned(), |p| p.as_str().to_owned()),
            host,
        })
    }

    fn request(&self, outgoing: Outgoing<'_>) -> Result<Request<Full<Bytes>>, FetchError> {
        let url = outgoing.url;
        let mut builder = Request::builder()
            .method(outgoing.method)
            .uri(self.path_and_query.as_str())
            .header(header::HOST, self.authority.as_str())
            .header(header::ACCEPT, "application/json")
            .header(header::USER_AGENT, "keygate")
            .header(header::CONNECTION, "close");
        if let Some(authorization) = outgoing.authorization {
            builder = builder.header(header::AUTHORIZATION, authorization);
        }
        let body = match outgoing.form {
            Some(form) => {
                builder = builder.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
                Bytes::from(form)
            }
            None => Bytes::new(),
        };
        builder
            .body(Full::new(body))
            .map_err(|e| error(url, format!("cannot build the request: {e}")))
    }
}

/// `application/x-www-form-urlencoded` text of `params` (also a query
/// string): every byte but RFC 3986's unreserved ones percent-encoded.
pub fn form(params: &[(&str, &str)]) -> String {
    params
        .iter()
        .map(|(name, value)| format!("{}={}", encode(name), encode(value)))
        .collect::<Vec<_>>()
        .join("&")
}

/// `text` with every byte but RFC 3986's unreserved ones percent-encoded.
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The `Authorization` value of `client_secret_basic` (RFC 6749, 2.3.1:
/// both parts form-encoded first).
pub fn basic(client_id: &str, secret: &str) -> String {
    use base64::Engine;
    let pair = format!("{}:{}", encode(client_id), encode(secret));
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

fn error(url: &str, reason: String) -> FetchError {
    FetchError {
        url: url.to_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_or_loopback_http_is_reached() {
        assert!(Target::of("https://idp.example/x").unwrap().https);
        let local = Target::of("http://127.0.0.1:9000/.well-known/openid-configuration").unwrap();
        assert!(!local.https);
        assert_eq!(local.port, 9000);
        assert_eq!(local.path_and_query, "/.well-known/openid-configuration");
        assert!(Target::of("http://localhost/").is_ok());
        assert!(Target::of("http://[::1]:8080/").is_ok());
        let refused = Target::of("http://idp.example/").unwrap_err();
        assert!(refused.reason.contains("loopback"), "{refused}");
        assert!(Target::of("ftp://idp.example/").is_err());
        assert!(Target::of("https://user:pw@idp.example/").is_err());
    }

    #[test]
    fn forms_and_basic_credentials_are_encoded() {
        assert_eq!(
            form(&[
                ("scope", "openid email"),
                ("redirect_uri", "https://g/x?y=1&z")
            ]),
            "scope=openid%20email&redirect_uri=https%3A%2F%2Fg%2Fx%3Fy%3D1%26z"
        );
        // "a%20b%3Ac:s%3A" in base64.
        assert_eq!(basic("a b:c", "s:"), "Basic YSUyMGIlM0FjOnMlM0E=");
        assert_eq!(basic("id", "pw"), "Basic aWQ6cHc=");
    }
}
