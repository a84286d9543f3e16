//! The decision's effects, in one place: verifying a credential through the
//! caches, what follows a secret sent in clear, the request quotas, and the
//! counting and logging of every refusal (`keygate_auth_total` through
//! [`Outcomes`], the `keygate::security` line of a key outside its scopes).

use std::net::SocketAddr;
use std::sync::Arc;

use crate::address::AddressKey;
use crate::auth::credential::Credential;
use crate::auth::in_clear::Exposure;
use crate::auth::outcomes::{self, NO_CREDENTIAL, Outcomes};
use crate::auth::{AuthFailure, AuthRefusal, Authenticator};
use crate::error::ApiError;
use crate::identity::Identity;
use crate::shared_limits::quota::{Grant, Quotas, Refusal as OverQuota, RouteQuota};

use super::input::{Asked, Presented};
use super::requirement::Requirement;
use super::verdict::Denial;
use super::{Decision, ScopeCheck};

/// How what the gate refuses came, for its log line.
#[derive(Debug, Clone, Copy)]
pub enum Channel<'a> {
    /// A request (an upgrade included).
    Request,
    /// A socket on a platform WebSocket route (its label).
    Socket(&'a str),
}

/// The pure [`Decision`] with the handles its effects need; one per server,
/// shared by every driver.
pub struct Gate {
    decision: Decision,
    auth: Arc<Authenticator>,
    outcomes: Outcomes,
    quotas: Arc<Quotas>,
}

impl Gate {
    pub fn new(
        decision: Decision,
        auth: Arc<Authenticator>,
        outcomes: Outcomes,
        quotas: Arc<Quotas>,
    ) -> Gate {
        Gate {
            decision,
            auth,
            outcomes,
            quotas,
        }
    }

    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// What follows a secret the decision refused as sent in clear: logged,
    /// an API key disabled when configured, counted; the refusal to answer.
    /// `channel`: "HTTP" or "ws://".
    pub async fn refuse_in_clear(
        &self,
        credential: &Credential,
        exposure: Exposure,
        peer: SocketAddr,
        from: Option<AddressKey>,
        channel: &str,
    ) -> ApiError {
        let rule = &self.decision.in_clear;
        let refused = self
            .auth
            .refuse_in_clear(credential, exposure, peer, rule, from, channel)
            .await;
        let method = outcomes::method_of(Some(credential));
        self.outcomes
            .count(method, Err(AuthFailure::PlaintextRefused));
        refused
    }

    /// Verifies the credential when `requirement` asks for one, then
    /// authorises ([`Decision::authorize`]); every outcome counted, a key
    /// outside its scopes logged. `from`: the key the client's address
    /// counts under, worked out only when a credential is verified.
    pub async fn authenticate(
        &self,
        asked: &Asked<'_>,
        credential: Presented<'_>,
        requirement: Requirement<'_>,
        from: impl FnOnce() -> AddressKey,
        channel: Channel<'_>,
    ) -> Result<Option<Identity>, AuthRefusal> {
        if !requirement.required {
            return match self.decision.authorize(asked, requirement.scope, None) {
                Ok(()) => Ok(None),
                Err(denial) => {
                    let method = outcomes::method_of(credential.ok());
                    self.outcomes.count(method, Err(denial.failure()));
                    Err(denial.failure().into())
                }
            };
        }
        let credential = credential.map_err(|failure| self.unread(failure))?;
        let method = outcomes::method_of(Some(credential));
        let identity = match self.auth.verify_explained(credential, from()).await {
            Ok(identity) => identity,
            Err(refusal) => {
                self.outcomes.count(method, Err(refusal.failure));
                return Err(refusal);
            }
        };
        self.authorized(asked, requirement.scope, identity, method, channel)
    }

    /// The verified identity, if the decision lets it have what it asked.
    fn authorized(
        &self,
        asked: &Asked<'_>,
        scope: ScopeCheck<'_>,
        identity: Identity,
        method: usize,
        channel: Channel<'_>,
    ) -> Result<Option<Identity>, AuthRefusal> {
        match self.decision.authorize(asked, scope, Some(&identity)) {
            Ok(()) => {
                self.outcomes.count(method, Ok(()));
                Ok(Some(identity))
            }
            Err(denial) => {
                self.outcomes.count(method, Err(denial.failure()));
                if denial == Denial::OutOfScope {
                    out_of_scope(asked, &identity, channel);
                }
                Err(denial.failure().into())
            }
        }
    }

    /// Counts a credential that could not be read (missing, malformed, or a
    /// socket's first frame that never brought one); its refusal.
    pub fn unread(&self, failure: AuthFailure) -> AuthRefusal {
        self.outcomes.count(NO_CREDENTIAL, Err(failure));
        failure.into()
    }

    /// The error a client gets for a refused credential.
    pub fn to_api_error(&self, failure: AuthFailure) -> ApiError {
        self.auth.to_api_error(failure)
    }

    /// Counts a request (or socket) against its identity's quotas on the
    /// route; over one, the refusal. Without an identity, nothing counts.
    pub fn admit_quota(
        &self,
        scope: &Arc<str>,
        quota: &RouteQuota,
        identity: Option<&Identity>,
    ) -> Result<Grant, OverQuota> {
        match identity {
            Some(identity) => self.quotas.admit(scope, quota, identity),
            None => Ok(Grant::default()),
        }
    }
}

/// The `keygate::security` line of a valid key used outside its scopes.
fn out_of_scope(asked: &Asked<'_>, identity: &Identity, channel: Channel<'_>) {
    match channel {
        Channel::Request => tracing::warn!(
            target: "keygate::security",
            key_id = %identity.credential_id(),
            user_id = %identity.principal.user_id,
            method = %asked.method,
            "request outside its API key's scopes refused"
        ),
        Channel::Socket(route) => tracing::warn!(
            target: "keygate::security",
            key_id = %identity.credential_id(),
            user_id = %identity.principal.user_id,
            route = %route,
            "WebSocket outside its API key's scopes refused"
        ),
    }
}
