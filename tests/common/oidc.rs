//! A real OpenID provider (`tests/oidc/provider.mjs`, the certified
//! `oidc-provider` package under node) on loopback, keygate configured to
//! sign in through it, and a cookie-keeping browser that walks the flow.
//!
//! The provider is `https://localhost:<port>` and keygate
//! `https://127.0.0.1:<port>`: two host names, so their cookies never mix.
//! The test writes the provider's signing key (a JWKS file) and keeps it, to
//! forge tokens the provider never issued.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use reqwest::Url;
use reqwest::cookie::{CookieStore, Jar};
use serde_json::{Value, json};

use super::{Gateway, Upstream};

pub const CLIENT_ID: &str = "keygate";
pub const CLIENT_SECRET: &str = "keygate-test-secret";
/// The registration's name in keygate (`/oauth2/authorization/corp`).
pub const NAME: &str = "corp";
/// The resource whose provider access tokens keygate accepts.
pub const API_AUDIENCE: &str = "https://api.keygate.test";
/// Another resource of the same provider: its tokens are not for keygate.
pub const OTHER_AUDIENCE: &str = "https://other.keygate.test";
/// What the browser types at the provider's login form (not checked there).
pub const PROVIDER_PASSWORD: &str = "through-the-looking-glass";

fn provider_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oidc")
}

/// Whether node and the provider's packages are here; when not, the check
/// is skipped (a failure where tools are required).
pub fn provider_available(check: &str) -> bool {
    let node = Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !matches!(node, Ok(status) if status.success()) {
        super::skipped_without("node", check);
        return false;
    }
    if !provider_dir().join("node_modules/oidc-provider").is_dir() {
        super::skipped_without("tests/oidc/node_modules (`npm ci` in tests/oidc)", check);
        return false;
    }
    true
}

/// The provider's P-256 signing key, which the test holds.
pub struct SigningKey {
    pub kid: String,
    pkcs8: Vec<u8>,
    /// The uncompressed public point (0x04 || x || y).
    point: Vec<u8>,
    d: Vec<u8>,
}

impl SigningKey {
    pub fn generate(kid: &str) -> SigningKey {
        use aws_lc_rs::encoding::AsBigEndian;
        use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
        let pair = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_FIXED_SIGNING).unwrap();
        let d = pair.private_key().as_be_bytes().unwrap().as_ref().to_vec();
        SigningKey {
            kid: kid.to_owned(),
            pkcs8: pair.to_pkcs8v1().unwrap().as_ref().to_vec(),
            point: pair.public_key().as_ref().to_vec(),
            d,
        }
    }

    /// The public JWK, as the provider publishes it.
    pub fn public_jwk(&self) -> Value {
        json!({
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": self.kid,
            "x": URL_SAFE_NO_PAD.encode(&self.point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&self.point[33..65]),
        })
    }

    /// The key set file the provider signs with (private members included).
    fn private_jwks(&self) -> Value {
        let mut jwk = self.public_jwk();
        jwk["d"] = json!(URL_SAFE_NO_PAD.encode(&self.d));
        json!({ "keys": [jwk] })
    }

    /// The public key as PEM (SubjectPublicKeyInfo): what an attacker would
    /// try as an HMAC secret.
    pub fn public_pem(&self) -> String {
        // The fixed DER prefix of a P-256 SubjectPublicKeyInfo.
        const PREFIX: &str = "3059301306072a8648ce3d020106082a8648ce3d030107034200";
        let mut der: Vec<u8> = (0..PREFIX.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&PREFIX[i..i + 2], 16).unwrap())
            .collect();
        der.extend_from_slice(&self.point);
        let body = base64::engine::general_purpose::STANDARD.encode(der);
        format!("-----BEGIN PUBLIC KEY-----\n{body}\n-----END PUBLIC KEY-----\n")
    }

    /// Signs `claims` with this key (ES256), with `kid` in the header.
    pub fn sign(&self, kid: &str, claims: &Value) -> String {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.kid = Some(kid.to_owned());
        header.typ = Some("at+jwt".to_owned());
        let key = jsonwebtoken::EncodingKey::from_ec_der(&self.pkcs8);
        jsonwebtoken::encode(&header, claims, &key).unwrap()
    }
}

/// A token whose header and claims are as given and whose signature is
/// `signature` (raw bytes, empty for `alg: none`).
pub fn unsigned_token(header: &Value, claims: &Value, signature: &[u8]) -> String {
    format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string()),
        URL_SAFE_NO_PAD.encode(signature)
    )
}

/// An HS256 token over `header`/`claims` with `secret` as the HMAC key.
pub fn hmac_token(header: &Value, claims: &Value, secret: &[u8]) -> String {
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, secret);
    let tag = aws_lc_rs::hmac::sign(&key, input.as_bytes());
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

/// The running provider; stopped (by its PID) when dropped.
pub struct Provider {
    child: Child,
    /// Held open: the provider exits when it closes (if this process dies).
    _stdin: Option<ChildStdin>,
    pub issuer: String,
    /// The private CA that signed the provider's certificate (keygate's
    /// `ca_file`).
    pub ca_file: PathBuf,
    pub ca_pem: Vec<u8>,
    pub key: SigningKey,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Provider {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Provider {
    /// Starts the provider on a free loopback port with `redirect_uri` the
    /// only one registered for the client, authenticating it at the token
    /// endpoint by `auth_method` (the only method its discovery lists).
    pub fn start(redirect_uri: &str, auth_method: &str) -> Provider {
        let dir = tempfile::tempdir().unwrap();
        keygate::tls::load_or_generate_dev(dir.path()).unwrap();
        let (ca_file, cert, key_file) = keygate::tls::dev_paths(dir.path());
        let key = SigningKey::generate(&format!("test-{}", uuid::Uuid::new_v4().simple()));
        let jwks = dir.path().join("jwks.json");
        std::fs::write(&jwks, key.private_jwks().to_string()).unwrap();
        let log = dir.path().join("provider.log");
        let mut child = Command::new("node")
            .arg(provider_dir().join("provider.mjs"))
            .arg("--port=0")
            .arg(format!("--cert={}", cert.display()))
            .arg(format!("--key={}", key_file.display()))
            .arg(format!("--jwks={}", jwks.display()))
            .arg(format!("--redirect-uri={redirect_uri}"))
            .arg(format!("--client-secret={CLIENT_SECRET}"))
            .arg(format!("--auth-method={auth_method}"))
            .current_dir(provider_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("node starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let _ = tx.send(line);
            }
        });
        let issuer = loop {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(line) => {
                    if let Some(issuer) = line.strip_prefix("ready ") {
                        break issuer.to_owned();
                    }
                }
                Err(_) => panic!(
                    "the OpenID provider did not start:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                ),
            }
        };
        let ca_pem = std::fs::read(&ca_file).unwrap();
        Provider {
            _stdin: child.stdin.take(),
            child,
            issuer,
            ca_file,
            ca_pem,
            key,
            log,
            _dir: dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.issuer)
    }

    /// A client that trusts the provider's CA (and resolves `localhost` to
    /// loopback IPv4, where the provider listens).
    pub fn client(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&self.ca_pem).unwrap())
            .resolve("localhost", SocketAddr::from(([127, 0, 0, 1], 0)))
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
    }

    /// How many times the key set has been fetched from the provider.
    pub async fn jwks_fetches(&self) -> u64 {
        let count: Value = self
            .client()
            .get(self.url("/test/jwks-count"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        count["count"].as_u64().unwrap()
    }

    /// What the provider wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Claims of an API access token for `email`, as the provider would
    /// sign them (for forging: change one and sign).
    pub fn access_claims(&self, email: &str) -> Value {
        let now = keygate::clock::now_secs() as i64;
        json!({
            "iss": self.issuer,
            "aud": API_AUDIENCE,
            "sub": email.split('@').next().unwrap(),
            "email": email,
            "email_verified": true,
            "scope": "api",
            "client_id": CLIENT_ID,
            "jti": uuid::Uuid::new_v4().simple().to_string(),
            "iat": now,
            "exp": now + 600,
        })
    }

    /// A token signed with the provider's own key (and kid).
    pub fn forge(&self, claims: &Value) -> String {
        self.key.sign(&self.key.kid, claims)
    }

    /// The provider's tokens for `user`, asked for by the test as the
    /// client itself through `browser` (authorization code with PKCE to
    /// `redirect_uri`, not followed; then the token endpoint), with
    /// `resource` for an API access token.
    pub async fn tokens(
        &self,
        browser: &Browser,
        redirect_uri: &str,
        user: &str,
        resource: Option<&str>,
    ) -> Value {
        let verifier = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        let scope = match resource {
            Some(_) => "openid email profile api",
            None => "openid email profile",
        };
        let mut authorize = Url::parse(&self.url("/auth")).unwrap();
        authorize
            .query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", CLIENT_ID)
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("scope", scope)
            .append_pair("state", "test-state")
            .append_pair("nonce", "test-nonce")
            .append_pair("code_challenge", &pkce_challenge(&verifier))
            .append_pair("code_challenge_method", "S256");
        if let Some(resource) = resource {
            authorize
                .query_pairs_mut()
                .append_pair("resource", resource);
        }
        let callback = browser.at_provider(authorize.as_str(), user).await;
        let code = query_param(&callback, "code")
            .unwrap_or_else(|| panic!("the provider gave no code: {callback}"));
        let answer = self
            .client()
            .post(self.url("/token"))
            .basic_auth(CLIENT_ID, Some(CLIENT_SECRET))
            .form(&[
                ("grant_type", "authorization_code"),
                ("code", &code),
                ("redirect_uri", redirect_uri),
                ("code_verifier", &verifier),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "the provider's token endpoint");
        answer.json().await.unwrap()
    }
}

/// A free loopback port (bound and released; keygate binds it next).
/// keygate signing in through a real provider, before a recording upstream.
pub struct Sso {
    pub provider: Provider,
    pub gateway: Gateway,
    pub upstream: Upstream,
    /// keygate's `server.public_base_url`: `https://127.0.0.1:<port>`.
    pub base: String,
}

impl Sso {
    /// Starts the provider and keygate with one `[[oidc]]` registration
    /// (`corp`), `settings` added to it (TOML lines of that table), and
    /// `extra` (other tables) added to keygate's config. `None` when the
    /// provider cannot run here (the check is then skipped).
    pub async fn start(check: &str, settings: &str, extra: &str) -> Option<Sso> {
        Sso::start_authenticating(check, "client_secret_basic", settings, extra).await
    }

    /// Like [`Sso::start`], with the client authenticated at the token
    /// endpoint by `auth_method`.
    pub async fn start_authenticating(
        check: &str,
        auth_method: &str,
        settings: &str,
        extra: &str,
    ) -> Option<Sso> {
        if !provider_available(check) {
            return None;
        }
        let port = super::free_port();
        let base = format!("https://127.0.0.1:{port}");
        let provider = Provider::start(&format!("{base}/login/oauth2/code/"), auth_method);
        let config = format!(
            r#"
[server]
public_base_url = "{base}"
[listen]
https = "127.0.0.1:{port}"
[[oidc]]
name = "{NAME}"
issuer = "{issuer}"
client_id = "{CLIENT_ID}"
client_secret = "{CLIENT_SECRET}"
button_label = "Corp login"
ca_file = "{ca_file}"
{settings}
"#,
            issuer = provider.issuer,
            ca_file = provider.ca_file.display(),
        );
        let upstream = Upstream::start().await;
        let gateway = Gateway::start(&upstream.url(), &super::merge_toml(&config, extra)).await;
        Some(Sso {
            provider,
            gateway,
            upstream,
            base,
        })
    }

    /// A browser with no cookies yet.
    pub fn browser(&self) -> Browser {
        Browser::new(&self.provider, Some(&self.gateway.ca_pem), &self.base)
    }

    /// A browser with no cookies yet that speaks only `wire` (HTTP/1.1, or
    /// HTTP/2 where the server offers it).
    pub fn browser_over(&self, wire: super::Wire) -> Browser {
        Browser::speaking(&self.provider, Some(&self.gateway.ca_pem), &self.base, wire)
    }

    /// `path` on keygate's public address.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The whole flow in a fresh browser as `user`: where keygate sends it
    /// at the end.
    pub async fn sign_in(&self, user: &str) -> Landing {
        self.browser().sign_in(user).await
    }

    /// The provider's tokens for `user`, asked for by the test as the
    /// client itself (authorization code with PKCE, then the token
    /// endpoint), with `resource` for an API access token.
    pub async fn provider_tokens(&self, user: &str, resource: Option<&str>) -> Value {
        let redirect_uri = self.url("/login/oauth2/code/");
        self.provider
            .tokens(&self.browser(), &redirect_uri, user, resource)
            .await
    }
}

/// The S256 code challenge of `verifier`.
pub fn pkce_challenge(verifier: &str) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, verifier.as_bytes());
    URL_SAFE_NO_PAD.encode(digest.as_ref())
}

/// The first value of query parameter `name` in `url`.
pub fn query_param(url: &str, name: &str) -> Option<String> {
    Url::parse(url)
        .ok()?
        .query_pairs()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}

/// `url` with query parameter `name` set to `value` (every other kept).
pub fn with_param(url: &str, name: &str, value: &str) -> String {
    let mut parsed = Url::parse(url).unwrap();
    let pairs: Vec<(String, String)> = parsed
        .query_pairs()
        .filter(|(key, _)| key != name)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    parsed
        .query_pairs_mut()
        .clear()
        .extend_pairs(pairs)
        .append_pair(name, value);
    parsed.to_string()
}

/// Where keygate's single sign-on left the browser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Landing {
    /// `{base}/?accessToken=...&refreshToken=...`
    Tokens { access: String, refresh: String },
    /// `{base}/?accessToken=...` with no refresh token: a token that only
    /// opens the second-factor step (as a password login's).
    SecondFactor(String),
    /// `{base}/login?loginError=...`
    Refused(String),
}

impl Landing {
    /// Reads keygate's final redirect, which must stay under `base`.
    pub fn of(base: &str, location: &str) -> Landing {
        assert_under(base, location);
        if let Some(error) = query_param(location, "loginError") {
            return Landing::Refused(error);
        }
        match (
            query_param(location, "accessToken"),
            query_param(location, "refreshToken"),
        ) {
            (Some(access), Some(refresh)) if !access.is_empty() && !refresh.is_empty() => {
                Landing::Tokens { access, refresh }
            }
            (Some(access), _) if !access.is_empty() => Landing::SecondFactor(access),
            _ => panic!("neither tokens nor an error in {location}"),
        }
    }

    pub fn tokens(self) -> (String, String) {
        match self {
            Landing::Tokens { access, refresh } => (access, refresh),
            other => panic!("single sign-on gave no token pair: {other:?}"),
        }
    }

    /// The token of a landing on the second-factor step.
    pub fn second_factor(self) -> String {
        match self {
            Landing::SecondFactor(access) => access,
            other => panic!("single sign-on did not stop at the second factor: {other:?}"),
        }
    }

    pub fn refusal(self) -> String {
        match self {
            Landing::Refused(error) => error,
            other => panic!("single sign-on succeeded where it must not: {other:?}"),
        }
    }
}

/// Asserts that `location` is an absolute URL under `base` (same scheme,
/// host and port; path from `/`), never anywhere else.
pub fn assert_under(base: &str, location: &str) {
    let parsed = Url::parse(location)
        .unwrap_or_else(|e| panic!("keygate redirected to {location:?}, not a URL: {e}"));
    let base = Url::parse(base).unwrap();
    assert_eq!(
        (parsed.scheme(), parsed.host_str(), parsed.port()),
        (base.scheme(), base.host_str(), base.port()),
        "keygate redirected outside its public address: {location}"
    );
    assert!(
        location.starts_with(&format!("{}/", base.as_str().trim_end_matches('/'))),
        "{location}"
    );
}

/// A browser: keeps cookies per host, follows no redirect by itself.
pub struct Browser {
    pub client: reqwest::Client,
    pub jar: Arc<Jar>,
    pub base: String,
    pub issuer: String,
}

impl Browser {
    /// A browser trusting the provider's CA and `gateway_ca` (keygate's),
    /// keygate being at `base`.
    pub fn new(provider: &Provider, gateway_ca: Option<&[u8]>, base: &str) -> Browser {
        Browser::speaking(provider, gateway_ca, base, super::Wire::Http2)
    }

    /// Like [`Browser::new`], speaking only HTTP/1.1 for `Wire::Http1`.
    pub fn speaking(
        provider: &Provider,
        gateway_ca: Option<&[u8]>,
        base: &str,
        wire: super::Wire,
    ) -> Browser {
        let jar = Arc::new(Jar::default());
        let mut builder = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&provider.ca_pem).unwrap());
        if let Some(ca) = gateway_ca {
            builder = builder.add_root_certificate(reqwest::Certificate::from_pem(ca).unwrap());
        }
        if wire == super::Wire::Http1 {
            builder = builder.http1_only();
        }
        let client = builder
            .resolve("localhost", SocketAddr::from(([127, 0, 0, 1], 0)))
            .cookie_provider(jar.clone())
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        Browser {
            client,
            jar,
            base: base.to_owned(),
            issuer: provider.issuer.clone(),
        }
    }

    /// keygate's sign-in buttons: `POST /api/noauth/oauth2Clients?platform=WEB`.
    pub async fn listing(&self) -> Vec<Value> {
        let answer = self
            .client
            .post(format!(
                "{}/api/noauth/oauth2Clients?platform=WEB",
                self.base
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "the listing of sign-in providers");
        answer.json().await.unwrap()
    }

    /// `GET` of `url` (relative to keygate's base when it starts with `/`).
    pub async fn get(&self, url: &str) -> reqwest::Response {
        let url = match url.starts_with('/') {
            true => format!("{}{url}", self.base),
            false => url.to_owned(),
        };
        self.client.get(url).send().await.unwrap()
    }

    /// Follows keygate's button (`/oauth2/authorization/<name>`): the
    /// provider's authorization URL keygate redirects to.
    pub async fn authorization(&self, button: &str) -> String {
        let answer = self.get(button).await;
        assert_eq!(answer.status(), 302, "{button}");
        let location = location(&answer);
        assert!(
            location.starts_with(&self.issuer),
            "keygate's authorization redirect goes to the provider: {location}"
        );
        location
    }

    /// Walks the provider from `url` as `user` (login form, consent form)
    /// until it redirects away from the provider: that URL (keygate's
    /// callback, with `code` and `state`, or an `error`).
    pub async fn at_provider(&self, url: &str, user: &str) -> String {
        let mut url = url.to_owned();
        for _ in 0..16 {
            if !url.starts_with(&self.issuer) {
                return url;
            }
            let answer = self.client.get(&url).send().await.unwrap();
            let answer = match answer.status().as_u16() {
                200 => {
                    let page = answer.text().await.unwrap();
                    self.submit(&page, user).await
                }
                _ => answer,
            };
            assert!(
                answer.status().is_redirection(),
                "the provider answered {} at {url}",
                answer.status()
            );
            url = Url::parse(&url)
                .unwrap()
                .join(&location(&answer))
                .unwrap()
                .to_string();
        }
        panic!("the provider never sent the browser back: {url}");
    }

    /// Submits the provider's login or consent form on `page`.
    async fn submit(&self, page: &str, user: &str) -> reqwest::Response {
        let action = between(page, "action=\"", "\"")
            .unwrap_or_else(|| panic!("no form on the provider's page:\n{page}"))
            .replace("&amp;", "&");
        let prompt = between(page, "name=\"prompt\" value=\"", "\"").unwrap_or_default();
        let form: Vec<(&str, &str)> = match prompt.as_str() {
            "login" => vec![
                ("prompt", "login"),
                ("login", user),
                ("password", PROVIDER_PASSWORD),
            ],
            "consent" => vec![("prompt", "consent")],
            other => panic!("unexpected provider prompt {other:?}:\n{page}"),
        };
        self.client.post(action).form(&form).send().await.unwrap()
    }

    /// keygate's callback at `url`: its redirect.
    pub async fn callback(&self, url: &str) -> reqwest::Response {
        assert!(
            url.starts_with(&self.base),
            "the callback is keygate's: {url}"
        );
        self.get(url).await
    }

    /// The cookie header keygate's callback would get from this browser.
    pub fn callback_cookie(&self) -> Option<String> {
        let url = Url::parse(&format!("{}/login/oauth2/code/", self.base)).unwrap();
        self.jar
            .cookies(&url)
            .map(|v| v.to_str().unwrap().to_owned())
    }

    /// listing -> authorization -> provider login and consent -> callback:
    /// where keygate sends the browser at the end.
    pub async fn sign_in(&self, user: &str) -> Landing {
        let listing = self.listing().await;
        let button = listing
            .iter()
            .find_map(|entry| entry["url"].as_str())
            .unwrap_or_else(|| panic!("no sign-in button listed: {listing:?}"))
            .to_owned();
        let authorization = self.authorization(&button).await;
        let callback = self.at_provider(&authorization, user).await;
        self.land(&callback).await
    }

    /// Calls keygate's callback at `url` and reads where it sends the browser.
    pub async fn land(&self, url: &str) -> Landing {
        let answer = self.callback(url).await;
        assert_eq!(answer.status(), 302, "keygate's callback redirects: {url}");
        assert_eq!(
            answer
                .headers()
                .get("referrer-policy")
                .map(|v| v.to_str().unwrap()),
            Some("no-referrer"),
            "tokens in a URL must not leak through Referer"
        );
        Landing::of(&self.base, &location(&answer))
    }
}

/// The `Location` of a redirect.
pub fn location(answer: &reqwest::Response) -> String {
    answer
        .headers()
        .get("location")
        .unwrap_or_else(|| panic!("no Location in a {} answer", answer.status()))
        .to_str()
        .unwrap()
        .to_owned()
}

fn between(text: &str, start: &str, end: &str) -> Option<String> {
    let from = text.find(start)? + start.len();
    let to = text[from..].find(end)? + from;
    Some(text[from..to].to_owned())
}
