//! An HTTPS upstream of the test's own on loopback that requires a client
//! certificate: its server certificate (for `127.0.0.1` and `localhost`)
//! signed by one generated CA, the client certificates it accepts by
//! another. It answers every request with `{"path": ...}`, echoes the
//! messages of a WebSocket upgrade, counts the connections it accepted and
//! records the client certificate each request came with.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use http::{Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;

/// A generated CA, kept to sign more certificates with.
struct Ca {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let pem = params.self_signed(&key).unwrap().pem();
        Ca { params, key, pem }
    }

    /// A certificate for `names` named `common_name`, for `usage`: its PEM
    /// and its key's PEM.
    fn sign(
        &self,
        names: &[&str],
        common_name: &str,
        usage: rcgen::ExtendedKeyUsagePurpose,
    ) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(ToString::to_string).collect();
        let mut params = rcgen::CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        params.extended_key_usages = vec![usage];
        let issuer = rcgen::Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    /// The client certificate of its connection (DER), if one was shown.
    pub client_cert: Option<Vec<u8>>,
}

pub struct TlsUpstream {
    pub addr: SocketAddr,
    /// The CA that signed the upstream's certificate: what keygate trusts.
    pub ca_file: PathBuf,
    /// A CA that signed nothing the upstream shows.
    pub other_ca_file: PathBuf,
    /// A client certificate the upstream accepts, and its key.
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    client_ca: Ca,
    accepted: Arc<AtomicUsize>,
    handshakes_failed: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
    _dir: tempfile::TempDir,
}

impl TlsUpstream {
    /// Starts the upstream, its files in a directory of its own.
    pub async fn start() -> TlsUpstream {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let server_ca = Ca::new("upstream server CA");
        let client_ca = Ca::new("upstream client CA");
        let other_ca = Ca::new("some other CA");
        let (server_cert, server_key) = server_ca.sign(
            &["127.0.0.1", "localhost"],
            "upstream",
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        );
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let ca_file = file("upstream-ca.pem", &server_ca.pem);
        let other_ca_file = file("other-ca.pem", &other_ca.pem);
        let cert_file = dir.path().join("client-cert.pem");
        let key_file = dir.path().join("client-key.pem");
        let config = server_config(&server_cert, &server_key, &client_ca.pem);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = TlsUpstream {
            addr: listener.local_addr().unwrap(),
            ca_file,
            other_ca_file,
            cert_file,
            key_file,
            client_ca,
            accepted: Arc::default(),
            handshakes_failed: Arc::default(),
            seen: Arc::default(),
            _dir: dir,
        };
        upstream.renew_client_certificate("keygate client 1");
        tokio::spawn(serve(
            listener,
            tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            upstream.accepted.clone(),
            upstream.handshakes_failed.clone(),
            upstream.seen.clone(),
        ));
        upstream
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Writes a new client certificate (and key) named `common_name` over
    /// the files, signed by the CA the upstream accepts; its DER.
    pub fn renew_client_certificate(&self, common_name: &str) -> Vec<u8> {
        let (cert, key) = self.client_ca.sign(
            &["keygate.internal"],
            common_name,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        );
        std::fs::write(&self.cert_file, &cert).unwrap();
        std::fs::write(&self.key_file, key).unwrap();
        der_of(&self.cert_file)
    }

    /// Connections accepted (TCP), whether their handshake succeeded or not.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// TLS handshakes that failed (no client certificate, or one refused).
    pub fn handshakes_failed(&self) -> usize {
        self.handshakes_failed.load(Ordering::SeqCst)
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// The DER of the first certificate in the PEM file at `path`.
pub fn der_of(path: &Path) -> Vec<u8> {
    CertificateDer::pem_file_iter(path)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

/// A server configuration that requires a client certificate signed by
/// `client_ca`, offering HTTP/1.1 by ALPN.
fn server_config(cert: &str, key: &str, client_ca: &str) -> rustls::ServerConfig {
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(client_ca.as_bytes()) {
        roots.add(ca.unwrap()).unwrap();
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
        .build()
        .unwrap();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let mut config = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

async fn serve(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    accepted: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        accepted.fetch_add(1, Ordering::SeqCst);
        let (acceptor, failed, seen) = (acceptor.clone(), failed.clone(), seen.clone());
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(tls) => tls,
                Err(_) => {
                    failed.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            };
            let client_cert = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|certs| certs.first())
                .map(|cert| cert.to_vec());
            let service = service_fn(move |req: Request<Incoming>| {
                seen.lock().unwrap().push(Seen {
                    path: req.uri().path().to_owned(),
                    client_cert: client_cert.clone(),
                });
                async move { Ok::<_, std::convert::Infallible>(answer(req)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .with_upgrades()
                .await;
        });
    }
}

/// `{"path": ...}`, or the switch to a WebSocket that echoes.
fn answer(mut req: Request<Incoming>) -> Response<Full<Bytes>> {
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if !upgrade {
        let body = serde_json::json!({ "path": req.uri().path() }).to_string();
        return Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
    }
    let key = req.headers().get("sec-websocket-key").cloned();
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(
        key.as_ref().map_or(&b""[..], |k| k.as_bytes()),
    );
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let mut socket =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        while let Some(Ok(message)) = socket.next().await {
            if message.is_close() {
                break;
            }
            if (message.is_text() || message.is_binary()) && socket.send(message).await.is_err() {
                break;
            }
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::UPGRADE, "websocket")
        .header(header::CONNECTION, "upgrade")
        .header("sec-websocket-accept", accept)
        .body(Full::new(Bytes::new()))
        .unwrap()
}
