//! What a target asks of a request's credential: whether one is required,
//! and what a scoped API key's grants must hold.

use http::Method;

use crate::api::{self, Access, Endpoint, Matched};
use crate::identity::Identity;
use crate::proxy::Route;

/// What a scoped API key must hold for a request: its class first (a
/// credential is never a scoped key's), then a grant of its method and path
/// ([`crate::auth::scope::Scopes::permit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeCheck<'p> {
    /// An endpoint keygate answers, with its class from the route table, on
    /// this normalised path.
    Endpoint(&'p str, api::Effect),
    /// A forwarded request (an upgrade and its socket included) on this
    /// normalised path: the one that decided the route, classed by
    /// [`api::proxied_effect`].
    Proxied(&'p str),
    /// Nothing: any valid key may.
    Exempt,
}

impl ScopeCheck<'_> {
    /// Always true for a credential without scopes.
    pub fn allows(self, identity: &Identity, method: &Method) -> bool {
        match self {
            ScopeCheck::Endpoint(path, effect) => identity.permits(method, path, || effect),
            ScopeCheck::Proxied(path) => {
                identity.permits(method, path, || api::proxied_effect(path))
            }
            ScopeCheck::Exempt => true,
        }
    }
}

/// What the credential must be for a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requirement<'p> {
    /// A credential must be presented and verify.
    pub required: bool,
    pub scope: ScopeCheck<'p>,
}

impl<'p> Requirement<'p> {
    /// A forwarded request, an upgrade included: a credential unless the
    /// route is public.
    pub fn proxied(route: &Route, path: &'p str) -> Requirement<'p> {
        Requirement {
            required: !route.public,
            scope: ScopeCheck::Proxied(path),
        }
    }

    /// A socket on a platform WebSocket route, once its credential is read:
    /// it always needs one, and a scoped key a `GET` grant of its path.
    pub fn socket(path: &'p str) -> Requirement<'p> {
        Requirement {
            required: true,
            scope: ScopeCheck::Proxied(path),
        }
    }

    /// An endpoint keygate answers. `mfa_token`: the request carries an MFA
    /// configuration token, which a route that takes one leaves to its
    /// handler; any other credential there is checked as usual.
    pub fn endpoint(matched: &Matched, path: &'p str, mfa_token: bool) -> Requirement<'p> {
        let required = match matched.route.access {
            Access::Authenticated => true,
            Access::Configuring => !mfa_token,
            Access::Public | Access::PreVerification | Access::MfaConfiguration => false,
        };
        let scope = match matched.route.endpoint {
            // Clients call it to check a key: any key may.
            Endpoint::CurrentUser => ScopeCheck::Exempt,
            _ => ScopeCheck::Endpoint(path, matched.route.effect),
        };
        Requirement { required, scope }
    }
}
