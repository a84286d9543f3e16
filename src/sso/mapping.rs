//! From a provider's verified claims to keygate's user: pure rules, the
//! store asked by the caller.
//!
//! - The e-mail comes from `email_claim` through the one e-mail rule
//!   ([`crate::email::check`]): folded the one way every address is, and a
//!   non-ASCII address refused, never folded onto another user.
//! - `email_verified` must be `true` unless `require_verified_email = false`.
//! - With `authority_claim`, the claim (a string or a list of strings) must
//!   hold a value of `authority_map`, whether the user exists or not; a user
//!   created then gets the highest authority the values map to.
//! - A disabled user is refused; an unknown one is created only when the
//!   provider allows it, where its settings say.

use serde_json::Value;

use super::token::Claims;
use crate::config::OidcSettings;
use crate::store::UserRecord;
use crate::vocab::identity::Authority;

/// `amr` values (RFC 8176) that show a factor beyond a password.
pub const SECOND_FACTOR_AMR: &[&str] = &[
    "mfa", "mca", "otp", "hwk", "swk", "sms", "tel", "sc", "fpt", "face", "iris", "retina", "vbm",
];

/// Who the claims name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    /// Folded ([`crate::email::fold`]).
    pub email: String,
    pub first_name: String,
    pub last_name: String,
    /// What `authority_map` gives, when the provider has one.
    pub mapped: Option<Authority>,
}

/// Why a sign-in's claims do not let anyone in. The message goes after
/// `loginError=`: it names no secret, only the user's own address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    NoEmail,
    Unverified,
    NotMapped,
    NotFound(String),
    Disabled,
}

impl Refusal {
    pub fn message(&self) -> String {
        match self {
            Refusal::NoEmail => {
                "Authentication failed: the ID token has no usable e-mail address".into()
            }
            Refusal::Unverified => "Authentication failed: e-mail is not verified".into(),
            Refusal::NotMapped => "Authentication failed: no longer allowed by the mapping".into(),
            // The platform's own words.
            Refusal::NotFound(email) => format!("User not found: {email}"),
            Refusal::Disabled => "Authentication failed: user is disabled".into(),
        }
    }
}

/// The person `claims` name under `settings`' rules.
pub fn person(claims: &Claims, settings: &OidcSettings) -> Result<Person, Refusal> {
    let email = claims
        .get(&settings.email_claim)
        .and_then(Value::as_str)
        .ok_or(Refusal::NoEmail)?;
    let email = crate::email::check(email).map_err(|_| Refusal::NoEmail)?;
    if settings.require_verified_email && !verified(claims.get("email_verified")) {
        return Err(Refusal::Unverified);
    }
    let text = |claim: &str| {
        claims
            .get(claim)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let mapped = match &settings.authority_rule {
        None => None,
        Some(rule) => {
            let values = strings(claims.get(&rule.claim));
            let found = rule
                .map
                .iter()
                .filter(|(value, _)| values.contains(&value.as_str()))
                .map(|(_, authority)| *authority);
            Some(highest(found).ok_or(Refusal::NotMapped)?)
        }
    };
    Ok(Person {
        email,
        first_name: text(&settings.first_name_claim),
        last_name: text(&settings.last_name_claim),
        mapped,
    })
}

/// `true`, or the text `"true"` some providers send.
fn verified(value: Option<&Value>) -> bool {
    match value {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s == "true",
        _ => false,
    }
}

/// A claim's string values: the string, or the strings of a list.
fn strings(value: Option<&Value>) -> Vec<&str> {
    match value {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

fn highest(found: impl Iterator<Item = Authority>) -> Option<Authority> {
    found.max_by_key(|authority| match authority {
        Authority::SysAdmin => 2,
        Authority::TenantAdmin => 1,
        Authority::CustomerUser => 0,
    })
}

/// What a sign-in does with the user found by the person's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Existing(Box<UserRecord>),
    Create(NewAccount),
}

/// A user a sign-in creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAccount {
    pub email: String,
    pub first_name: String,
    pub last_name: String,
    pub authority: Authority,
    pub tenant_id: uuid::Uuid,
    pub customer_id: Option<uuid::Uuid>,
}

/// The sign-in's outcome for `person`, whose address finds `found`.
pub fn decide(
    person: Person,
    found: Option<UserRecord>,
    settings: &OidcSettings,
) -> Result<Decision, Refusal> {
    match found {
        Some(user) if !user.enabled => Err(Refusal::Disabled),
        Some(user) => Ok(Decision::Existing(Box::new(user))),
        None => {
            let creation = settings
                .creation
                .ok_or_else(|| Refusal::NotFound(person.email.clone()))?;
            Ok(Decision::Create(NewAccount {
                authority: person.mapped.unwrap_or(creation.authority),
                email: person.email,
                first_name: person.first_name,
                last_name: person.last_name,
                tenant_id: creation.tenant_id,
                customer_id: creation.customer_id,
            }))
        }
    }
}

/// Whether the ID token's `amr` shows a second factor.
pub fn shows_second_factor(claims: &Claims) -> bool {
    strings(claims.get("amr"))
        .iter()
        .any(|amr| SECOND_FACTOR_AMR.contains(amr))
}
