//! The one input of the decision: a request's head, its sender and its
//! credential, parsed once by the driver that read the head.

use http::{HeaderMap, Method, Uri};

use crate::auth::AuthFailure;
use crate::auth::credential::{Credential, CredentialError};
use crate::auth::in_clear::Sender;

/// A request's credential as read from its head.
pub type Parsed = Result<Credential, CredentialError>;

/// What every driver hands the decision about one request. The URI is
/// borrowed apart (`'u`): the normalised path, borrowed from it, outlives
/// the rest of the input.
#[derive(Clone, Copy)]
pub struct Input<'r, 'u> {
    pub method: &'r Method,
    pub uri: &'u Uri,
    pub headers: &'r HeaderMap,
    /// Who sent it, as far as the connection and a trusted proxy tell.
    pub sender: Sender,
    /// A WebSocket upgrade.
    pub upgrade: bool,
    /// The head stated its body length two ways (hyper's driver marks it).
    pub ambiguous_framing: bool,
    /// The credential of its head, parsed once.
    pub credential: &'r Parsed,
}

impl Input<'_, '_> {
    /// Approximate size of the head as sent: names, values and separators.
    pub fn head_size(&self) -> usize {
        self.headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum::<usize>()
            + self.uri.path_and_query().map_or(0, |p| p.as_str().len())
    }
}

/// What is asked of the gate, once the target is known: the method and
/// the normalised path a scoped key's grants and every [`super::Rule`]
/// see, and whether it is a WebSocket (an upgrade, or a socket it opened).
#[derive(Debug, Clone, Copy)]
pub struct Asked<'r> {
    pub method: &'r Method,
    pub path: &'r str,
    pub upgrade: bool,
}

/// A credential as the gate takes it: read, or why none could be.
pub type Presented<'c> = Result<&'c Credential, AuthFailure>;

/// A request's parsed credential as the gate takes it.
pub fn presented(parsed: &Parsed) -> Presented<'_> {
    parsed.as_ref().map_err(|error| AuthFailure::from(*error))
}
