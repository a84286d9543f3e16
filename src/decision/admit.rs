//! Admission: what must not go further, decided before anything is
//! looked up: an oversized head, ambiguous framing, a header name that
//! folds to a framing one, a path that does not normalise, a secret sent in
//! clear.

use std::borrow::Cow;

use crate::auth::in_clear::{self, InClear};
use crate::path;
use crate::proxy::headers;

use super::input::Input;
use super::verdict::Refusal;

/// The normalised path of an admitted request, or why it is refused.
pub fn admit<'u>(
    input: &Input<'_, 'u>,
    max_header_bytes: usize,
    rule: &InClear,
) -> Result<Cow<'u, str>, Refusal> {
    if input.head_size() > max_header_bytes {
        return Err(Refusal::HeadTooLarge);
    }
    if input.ambiguous_framing {
        return Err(Refusal::AmbiguousFraming);
    }
    headers::refuse_folded_framing(input.headers).map_err(Refusal::FoldedName)?;
    let path = path::normalize(input.uri.path()).map_err(Refusal::Path)?;
    if let Ok(credential) = input.credential
        && let Some(exposure) = in_clear::exposure(credential, input.sender, rule)
    {
        return Err(Refusal::InClear(exposure));
    }
    Ok(path)
}
