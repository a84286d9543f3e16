//! One socket from upgrade to close: authenticate, hold the credential,
//! open the upstream socket, splice ([`super::splice`]), close, log.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt as _, StreamExt as _};
use http::HeaderValue;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::WebSockets;
use super::ending::{ClientSocket, Ending, UpstreamSocket};
use super::first_frame::{self, FrameError};
use super::handshake::{self, Form};
use super::metrics::{ACCEPTED, DEADLINE, NO_AUTH_CMD};
use super::seat::Seat;
use super::splice::{self, Traffic};
use crate::address::AddressKey;
use crate::auth::AuthFailure;
use crate::auth::credential::Credential;
use crate::auth::live::{HoldLimits, OverLimit};
use crate::decision::{Asked, Channel, Presented, Requirement};
use crate::identity::Identity;
use crate::identity::IdentityMode;
use crate::identity::passport::Destination;
use crate::listener::peer::{Client, Peer};
use crate::proxy::headers;
use crate::proxy::stream::{Endpoint, OpenError};
use crate::telemetry::access::{AccessLine, SocketEnd};

/// How the socket is to be authenticated, as the upgrade decided.
pub enum Opening {
    /// The platform's ways: the upgrade's own credential if it carried one
    /// (and how), else the first frame's `authCmd`.
    Platform(Option<(Form, Result<Credential, AuthFailure>)>),
    /// Checked like any request already (not a platform WebSocket route).
    Checked(Option<(Identity, Credential)>),
}

/// One upgraded request, with what its task needs.
pub struct Session {
    pub sockets: Arc<WebSockets>,
    pub conn: Peer,
    pub secure: bool,
    /// The key the client's address counts under in per-address limits.
    pub from: AddressKey,
    /// The upgrade's head, without the `token` parameter.
    pub parts: http::request::Parts,
    pub upstream_uri: http::Uri,
    pub upstream: String,
    /// Where the upstream socket's connection goes, with its route's TLS.
    pub endpoint: Endpoint,
    /// The route's count of failed TLS handshakes with its upstreams.
    pub tls_failures: Option<crate::proxy::TlsFailures>,
    pub connect_timeout: Duration,
    pub request_id: HeaderValue,
    pub label: String,
    /// The upgrade's normalised path: a scoped key needs a `GET` grant
    /// holding it.
    pub path: Box<str>,
    pub started: Instant,
    /// The accepted connection's place in the listener's budget, held until
    /// the socket closes; it also signals the drain on shutdown.
    pub hold: Option<crate::listener::Hold>,
    /// The quotas the socket counts against once authenticated; `None` when
    /// the request path counted its upgrade already.
    pub quota: Option<super::SocketQuota>,
    /// How the identity travels to the upstream of the route the socket
    /// falls under.
    pub destination: Destination,
}

/// An authenticated socket, ready for its upstream.
struct Authenticated {
    identity: Option<Identity>,
    credential: Option<Credential>,
    /// What the first frame holds beyond `authCmd`, to forward.
    first: Option<String>,
}

/// What both ends of a socket read with: tungstenite's own read buffer is
/// 128 KiB, and each read first zero-fills all of it, which was 22% of
/// keygate's CPU time relaying 1 KiB messages (`perf`, `benches/run`'s
/// WebSocket case). A longer message still arrives whole, over more reads.
pub(crate) fn socket_config() -> WebSocketConfig {
    WebSocketConfig::default().read_buffer_size(READ_BUFFER)
}

const READ_BUFFER: usize = 8 * 1024;

impl Session {
    pub async fn run(self, on_upgrade: OnUpgrade, opening: Opening) {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let sockets = self.sockets.clone();
        let open = sockets.metrics.opened(&self.label);
        let config = socket_config()
            .max_message_size(Some(sockets.settings.max_message_bytes))
            .max_frame_size(Some(sockets.settings.max_message_bytes));
        let mut client =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config))
                .await;
        let mut traffic = Traffic::default();
        let mut identity = None;
        let ending = self
            .serve(&mut client, opening, &mut traffic, &mut identity)
            .await;
        sockets.metrics.closed(&ending);
        drop(open);
        self.log(&ending, &traffic, identity.as_ref());
        close(&mut client, ending.client_frame()).await;
    }

    /// Everything between the upgrade and the close.
    async fn serve(
        &self,
        client: &mut ClientSocket,
        opening: Opening,
        traffic: &mut Traffic,
        identity: &mut Option<Identity>,
    ) -> Ending {
        let (mut upstream, seat, credential) = match self.open(client, opening, identity).await {
            Ok(opened) => opened,
            Err(ending) => return ending,
        };
        let recheck = match (&seat, credential) {
            (Some(seat), Some(credential)) => Some(splice::Recheck {
                held: seat.held(),
                credential,
                auth: &self.sockets.auth,
                every: self.sockets.recheck_every,
            }),
            _ => None,
        };
        let drain = self.drain();
        let settings = &self.sockets.settings;
        let ending = splice::run(client, &mut upstream, recheck, drain, settings, traffic).await;
        if !matches!(ending, Ending::UpstreamClosed(_)) {
            // The client's close does not wait for the upstream's answer.
            let frame = ending.upstream_frame();
            tokio::spawn(async move { close(&mut upstream, frame).await });
        }
        ending
    }

    /// Authenticates, holds the credential, opens the upstream socket and
    /// forwards what the first frame left.
    async fn open(
        &self,
        client: &mut ClientSocket,
        opening: Opening,
        identity: &mut Option<Identity>,
    ) -> Result<(UpstreamSocket, Option<Seat>, Option<Credential>), Ending> {
        let authenticated = self.authenticate(client, opening).await?;
        identity.clone_from(&authenticated.identity);
        self.admit_quota(authenticated.identity.as_ref())?;
        let seat = self.seat(authenticated.identity.as_ref()).await?;
        let mut upstream = self
            .connect(authenticated.identity.as_ref())
            .await
            .ok_or(Ending::UpstreamUnavailable)?;
        if let Some(first) = authenticated.first {
            upstream
                .send(Message::text(first))
                .await
                .map_err(|_| Ending::UpstreamUnavailable)?;
        }
        Ok((upstream, seat, authenticated.credential))
    }

    /// The drain signal of the listener that accepted the connection.
    fn drain(&self) -> tokio::sync::watch::Receiver<bool> {
        match &self.hold {
            Some(hold) => hold.draining(),
            // Never signalled: the sender is dropped, and `changed` errors
            // are read as "no drain".
            None => tokio::sync::watch::channel(false).1,
        }
    }

    /// The credential from the upgrade, else from the first frame; refused
    /// in clear as over HTTP; verified and authorised by the one decision
    /// ([`crate::decision::Gate`]), through the same checks and caches.
    async fn authenticate(
        &self,
        client: &mut ClientSocket,
        opening: Opening,
    ) -> Result<Authenticated, Ending> {
        let (form, credential, first) = match opening {
            Opening::Checked(checked) => {
                let (identity, credential) = checked.unzip();
                return Ok(Authenticated {
                    identity,
                    credential,
                    first: None,
                });
            }
            Opening::Platform(Some((form, Ok(credential)))) => (form, credential, None),
            Opening::Platform(Some((form, Err(failure)))) => {
                return Err(self.unread(form, failure).await);
            }
            Opening::Platform(None) => {
                let frame = self.first_frame(client).await?;
                (Form::AuthCmd, frame.credential, frame.rest)
            }
        };
        self.refuse_in_clear(form, &credential).await?;
        let identity = self.decide(form, Ok(&credential)).await?;
        Ok(Authenticated {
            identity,
            credential: Some(credential),
            first,
        })
    }

    /// The gate's answer for the socket's credential, as a `GET` of its
    /// path: the identity, or how the socket closes. Counted by form here;
    /// everything else the gate counts and logs.
    async fn decide(
        &self,
        form: Form,
        credential: Presented<'_>,
    ) -> Result<Option<Identity>, Ending> {
        let get = http::Method::GET;
        let asked = Asked {
            method: &get,
            path: &self.path,
            upgrade: true,
        };
        let requirement = Requirement::socket(&self.path);
        let channel = Channel::Socket(&self.label);
        let outcome = self
            .sockets
            .gate
            .authenticate(&asked, credential, requirement, || self.from, channel)
            .await;
        match outcome {
            Ok(identity) => {
                self.sockets.metrics.auth(form, ACCEPTED);
                Ok(identity)
            }
            Err(refusal) => Err(self.refused(form, refusal.failure)),
        }
    }

    /// A credential that could not be read, refused by the gate as any.
    async fn unread(&self, form: Form, failure: AuthFailure) -> Ending {
        match self.decide(form, Err(failure)).await {
            Err(ending) => ending,
            // A socket always needs a credential: never reached.
            Ok(_) => Ending::BadCredential(failure),
        }
    }

    /// Counts a first frame that never brought a credential: by its form's
    /// `result`, and as a missing credential.
    fn unauthenticated(&self, result: &str) {
        self.sockets.metrics.auth(Form::AuthCmd, result);
        self.sockets.gate.unread(AuthFailure::Missing);
    }

    /// Counts a refused credential by form and says how the socket closes.
    fn refused(&self, form: Form, failure: AuthFailure) -> Ending {
        self.sockets.metrics.auth(form, failure.label());
        match (form, failure) {
            (Form::QueryToken, AuthFailure::TokenExpired) => Ending::QueryTokenExpired,
            // The address spent its budget of unknown-key lookups.
            (_, AuthFailure::LookupsSpent) => Ending::RateLimited,
            _ => Ending::BadCredential(failure),
        }
    }

    /// Waits (bounded, and not past a drain) for the first data frame and
    /// reads its `authCmd`.
    async fn first_frame(
        &self,
        client: &mut ClientSocket,
    ) -> Result<first_frame::FirstFrame, Ending> {
        let deadline = self.sockets.settings.auth_timeout;
        let mut drain = self.drain();
        let text = tokio::select! {
            read = tokio::time::timeout(deadline, first_data(client)) => match read {
                Err(_) => {
                    self.unauthenticated(DEADLINE);
                    return Err(Ending::AuthDeadline);
                }
                Ok(read) => read?,
            },
            () = splice::drained(&mut drain) => return Err(Ending::Shutdown),
        };
        match text.as_deref().map(first_frame::parse) {
            Some(Ok(frame)) => Ok(frame),
            Some(Err(FrameError::BadCredential)) => {
                Err(self.unread(Form::AuthCmd, AuthFailure::Malformed).await)
            }
            Some(Err(FrameError::MissingAuthCmd)) | None => {
                self.unauthenticated(NO_AUTH_CMD);
                Err(Ending::MissingAuthCmd)
            }
        }
    }

    /// Secrets over plain `ws://`: the decision's rule for plain HTTP
    /// ([`crate::auth::in_clear`]); what follows a refusal is the gate's.
    async fn refuse_in_clear(&self, form: Form, credential: &Credential) -> Result<(), Ending> {
        let gate = &self.sockets.gate;
        let client = Client {
            conn: &self.conn,
            secure: self.secure,
        };
        let Some(exposure) = gate.decision().exposure(credential, client.sender()) else {
            return Ok(());
        };
        let peer = self.conn.peer;
        let reason = gate
            .refuse_in_clear(credential, exposure, peer, Some(self.from), "ws://")
            .await;
        self.sockets
            .metrics
            .auth(form, AuthFailure::PlaintextRefused.label());
        Err(Ending::PlaintextRefused(match reason.message {
            std::borrow::Cow::Borrowed(text) => text,
            std::borrow::Cow::Owned(_) => "Credentials are accepted only over HTTPS",
        }))
    }

    /// Counts the socket against its identity's request quotas on its
    /// route, as the request its upgrade was; over one, it closes before
    /// its upstream is contacted.
    fn admit_quota(&self, identity: Option<&Identity>) -> Result<(), Ending> {
        let Some(quota) = &self.quota else {
            return Ok(());
        };
        match self
            .sockets
            .gate
            .admit_quota(&quota.scope, &quota.quota, identity)
        {
            Ok(_) => Ok(()),
            Err(_) => Err(Ending::RateLimited),
        }
    }

    /// Holds the credential, within the per-user and per-tenant limits.
    async fn seat(&self, identity: Option<&Identity>) -> Result<Option<Seat>, Ending> {
        let Some(identity) = identity else {
            return Ok(None);
        };
        let settings = &self.sockets.settings;
        let limits = HoldLimits {
            per_user: settings.max_per_user,
            per_tenant: settings.max_per_tenant,
        };
        let live = &self.sockets.auth.caches().live;
        match Seat::take(live, self.sockets.seats.as_ref(), identity, limits).await {
            Ok(seat) => Ok(Some(seat)),
            Err(OverLimit::User) => Err(Ending::UserLimit),
            Err(OverLimit::Tenant) => Err(Ending::TenantLimit),
        }
    }

    /// Opens the upstream socket, its upgrade carrying the verified identity
    /// and none of the client's identity or credential headers.
    /// Over TLS to an `https://` upstream, with the route's settings; a
    /// failed handshake is counted and logged as a request's is.
    async fn connect(&self, identity: Option<&Identity>) -> Option<UpstreamSocket> {
        let request = self.upstream_request(identity)?;
        let attempt = async {
            let stream = match self.endpoint.open(self.connect_timeout).await {
                Ok(stream) => stream,
                Err(OpenError::Handshake(error)) => {
                    if let Some(failures) = &self.tls_failures {
                        let reason = crate::proxy::stream::handshake_reason(&error);
                        failures.count(self.endpoint.host(), &reason);
                    }
                    return Err(());
                }
                Err(OpenError::Connect(_)) => return Ok(None),
            };
            let (socket, _) =
                tokio_tungstenite::client_async_with_config(request, stream, Some(socket_config()))
                    .await
                    .ok()
                    .unzip();
            Ok(socket)
        };
        match tokio::time::timeout(self.connect_timeout, attempt).await {
            Ok(Ok(Some(socket))) => Some(socket),
            Ok(Err(())) => None,
            _ => {
                tracing::warn!(upstream = %self.upstream, "WebSocket upstream refused or unreachable");
                None
            }
        }
    }

    /// The upstream upgrade: the client's head edited by
    /// [`headers::to_websocket_upstream`], on the handshake's own request.
    fn upstream_request(&self, identity: Option<&Identity>) -> Option<http::Request<()>> {
        let (mut parts, ()) = http::Request::new(()).into_parts();
        parts.headers = self.parts.headers.clone();
        parts.uri = self.upstream_uri.clone();
        let client = Client {
            conn: &self.conn,
            secure: self.secure,
        };
        let mut passport = match identity {
            Some(identity) => self
                .sockets
                .passports
                .issue(&self.destination, identity)
                .ok()?,
            None => None,
        };
        let mut uri = self.upstream_uri.clone();
        // The platform reads a socket's token from `?token=` on every
        // WebSocket endpoint (`TbWebSocketHandler.toRef`); its first-frame
        // `authCmd` is read on `/api/ws` only. Whatever `token` the client's
        // query held is replaced, or removed on a public route.
        if self.destination.mode == IdentityMode::Platform {
            match passport.take() {
                Some(token) => {
                    let token = token.value.as_bytes().strip_prefix(b"Bearer ")?;
                    uri = handshake::with_token(uri, token)?;
                }
                None => {
                    handshake::take_token(&mut uri);
                }
            }
        }
        headers::to_websocket_upstream(
            &mut parts,
            &client,
            self.request_id.clone(),
            identity,
            passport.as_ref(),
        );
        let mut request = uri.into_client_request().ok()?;
        request.headers_mut().extend(parts.headers);
        Some(request)
    }

    /// The access line of the socket, at its close: never a token or a key.
    fn log(&self, ending: &Ending, traffic: &Traffic, identity: Option<&Identity>) {
        if !self.sockets.access_log {
            return;
        }
        let code = ending.client_frame().map(|frame| u16::from(frame.code));
        AccessLine {
            request_id: self.request_id.to_str().unwrap_or(""),
            method: "GET",
            path: self.parts.uri.path(),
            route: self.label.as_str(),
            status: 101,
            elapsed: self.started.elapsed(),
            peer: self.conn.peer,
            upstream: Some(self.upstream.as_str()),
            identity,
            refusal: None,
            bytes: None,
            trace_id: None,
            socket: Some(SocketEnd {
                ending: ending.label(),
                close_code: code,
                bytes_in: traffic.from_client,
                bytes_out: traffic.to_client,
            }),
        }
        .emit();
    }
}

/// The first text or binary message's text (`None` for binary); pings and
/// pongs before it are skipped.
async fn first_data(client: &mut ClientSocket) -> Result<Option<String>, Ending> {
    loop {
        match client.next().await {
            Some(Ok(Message::Text(text))) => return Ok(Some(text.as_str().to_owned())),
            Some(Ok(Message::Binary(_))) => return Ok(None),
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
            Some(Ok(Message::Close(frame))) => return Err(Ending::ClientClosed(frame)),
            Some(Err(WsError::Capacity(_))) => return Err(Ending::MessageTooBig),
            Some(Err(_)) | None => return Err(Ending::ClientGone),
        }
    }
}

/// Sends a close frame (or flushes the reply to the peer's), then reads
/// briefly for the peer's answer so the connection ends cleanly.
pub async fn close<S>(socket: &mut WebSocketStream<S>, frame: Option<CloseFrame>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let _ = socket.close(frame).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(Ok(_)) = socket.next().await {}
    })
    .await;
}
