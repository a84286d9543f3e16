//! The shared vocabulary: the values every floor above speaks, so that no
//! lower module has to import a higher one for a type. It imports nothing
//! of keygate's.
//!
//! - [`identity`]: who a request is ([`identity::Identity`],
//!   [`identity::Principal`], [`identity::Authority`]) and how a route
//!   passes it on ([`identity::IdentityMode`]).
//! - [`scope`]: a scoped API key's grants ([`scope::Scopes`]) and what a
//!   request does ([`scope::Effect`]).
//! - [`refusal`]: why a credential was refused.
//! - [`revocation`]: what a change that can end credentials publishes.
//! - [`settings`]: values the configuration and the store share.
//! - [`decline`]: why the lean HTTP/1 path left a request to hyper.

pub mod decline;
pub mod identity;
pub mod refusal;
pub mod revocation;
pub mod scope;
pub mod settings;
