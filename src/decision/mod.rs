//! The one decision over a request, asked by every driver: hyper's server
//! (`listener::serve` → `App::handle`), the lean HTTP/1.1 path
//! (`listener::h1fast` → `App::fast_decide`) and WebSocket
//! sessions (`websocket`). They differ only in how they read and
//! write bytes.
//!
//! Pure, over one [`Input`] (the head, its sender and its credential, parsed
//! once), a rule per file, composed here:
//!
//! 1. [`admit`](admit::admit): head size, ambiguous framing, folded framing
//!    names, path normalisation, a secret sent in clear;
//! 2. [`dispatch`](target::dispatch): the one [`Target`];
//! 3. [`Requirement`]: whether the target asks for a credential, and what a
//!    scoped key's grants must hold;
//! 4. [`Decision::authorize`]: once the credential verified, the scope
//!    check and every added [`Rule`].
//!
//! What has effects (verifying a credential through the cache, disabling a
//! key sent in clear, counting quotas, counting and logging refusals) is
//! the [`Gate`]'s, in one place: each driver calls it, none repeats it.

mod admit;
mod gate;
mod input;
mod requirement;
mod rule;
mod target;
mod verdict;

#[cfg(test)]
mod tests;

use crate::auth::credential::Credential;
use crate::auth::in_clear::{self, Exposure, InClear, Sender};
use crate::config::Settings;
use crate::identity::Identity;
use crate::proxy::RouteTable;

pub use gate::{Channel, Gate};
pub use input::{Asked, Input, Parsed, Presented, presented};
pub use requirement::{Requirement, ScopeCheck};
pub use rule::{Rule, Rules};
pub use target::{Tables, Target, dispatch, websocket_route};
pub use verdict::{Admitted, Denial, Refusal};

/// The decision's settings, fixed at start, and the rules added to it.
pub struct Decision {
    max_header_bytes: usize,
    in_clear: InClear,
    browser: bool,
    sync_upstream: Option<String>,
    websocket_routes: Vec<String>,
    rules: Rules,
}

impl Decision {
    pub fn new(settings: &Settings, rules: Rules) -> Decision {
        Decision {
            max_header_bytes: settings.limits.max_header_bytes,
            in_clear: InClear {
                disable_keys: settings.disable_key_on_plaintext,
                allow_plaintext: settings.listen.allow_plaintext_credentials,
                provider_issuers: settings
                    .oidc
                    .iter()
                    .filter(|p| p.access_token_audience.is_some())
                    .map(|p| p.issuer.clone())
                    .collect(),
            },
            browser: settings.api_browser.enabled,
            sync_upstream: settings.platform.sync.as_ref().map(|s| s.upstream.clone()),
            websocket_routes: settings.websocket.routes.clone(),
            rules,
        }
    }

    /// Admission, then dispatch: the request's normalised path and target,
    /// or why it goes no further.
    pub fn evaluate<'t, 'u>(
        &'t self,
        input: &Input<'_, 'u>,
        routes: &'t RouteTable,
    ) -> Result<Admitted<'t, 'u>, Refusal> {
        let path = admit::admit(input, self.max_header_bytes, &self.in_clear)?;
        let tables = Tables {
            browser: self.browser,
            sync_upstream: self.sync_upstream.as_deref(),
            routes,
            websocket_routes: &self.websocket_routes,
        };
        let target =
            dispatch(&tables, input.method, &path, input.upgrade).map_err(Refusal::NoTarget)?;
        Ok(Admitted { path, target })
    }

    /// Once the credential is verified (or none was asked for): the scope
    /// check, then every added rule.
    pub fn authorize(
        &self,
        asked: &Asked<'_>,
        scope: ScopeCheck<'_>,
        identity: Option<&Identity>,
    ) -> Result<(), Denial> {
        if let Some(identity) = identity
            && !scope.allows(identity, asked.method)
        {
            return Err(Denial::OutOfScope);
        }
        match self.rules.refuse(asked, identity) {
            Some(failure) => Err(Denial::Rule(failure)),
            None => Ok(()),
        }
    }

    /// The in-clear rule for a credential read after admission (a socket's
    /// first frame).
    pub fn exposure(&self, credential: &Credential, sender: Sender) -> Option<Exposure> {
        in_clear::exposure(credential, sender, &self.in_clear)
    }

    /// The platform WebSocket route a normalised path falls under.
    pub fn websocket_route(&self, path: &str) -> Option<&str> {
        websocket_route(&self.websocket_routes, path)
    }
}
