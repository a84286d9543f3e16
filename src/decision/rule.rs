//! Rules added to the decision: each runs wherever a request or a socket is
//! authorised, on every driver, after the checks keygate makes itself.

use std::sync::Arc;

use crate::auth::AuthFailure;
use crate::identity::Identity;

use super::input::Asked;

/// A refusal written once: the decision asks it of every request it
/// authorises (hyper's driver, the lean HTTP/1.1 path, WebSocket upgrades,
/// and a platform socket once its credential is read), with the verified
/// identity when the target asked for one. A refusal is answered, counted
/// and logged as the failure it names.
pub trait Rule: Send + Sync + 'static {
    /// `Some` refuses.
    fn refuse(&self, asked: &Asked<'_>, identity: Option<&Identity>) -> Option<AuthFailure>;
}

/// The rules a server adds to its decision, in the order they are asked.
#[derive(Clone, Default)]
pub struct Rules(pub Vec<Arc<dyn Rule>>);

impl Rules {
    /// The first refusal of any rule.
    pub fn refuse(&self, asked: &Asked<'_>, identity: Option<&Identity>) -> Option<AuthFailure> {
        self.0.iter().find_map(|rule| rule.refuse(asked, identity))
    }
}

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Rules({})", self.0.len())
    }
}
