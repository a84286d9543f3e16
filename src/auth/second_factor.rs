//! The second-factor gate: the one place that decides whether a user may
//! have a token pair now, and the only maker of the value that says so.
//!
//! A session's first token pair is opened only for a [`Cleared`]
//! (`api::session`'s `issue_pair` takes one by value), and a `Cleared` comes
//! only from this module:
//!
//! - [`Gate::check`]: a user none is due for (no provider that counts, and
//!   none enforced); else the login waits, as [`Pending`]: for a code
//!   ([`Pending::Verify`]) or for a provider to be configured first
//!   ([`Pending::Configure`]). Login, activation and a password change by
//!   API key go through it.
//! - [`Gate::passed`]: a code checked right for the user, a [`Verified`],
//!   which only this module's checks make ([`check_totp`],
//!   [`check_backup_code`], [`check_mailed_code`]), or a factor a trusted
//!   identity provider proved at a single sign-on ([`check_provider_factor`]).
//! - [`Gate::configured`]: the holder of an MFA configuration token whose
//!   enforced provider is configured now (saving one proves a code of it).
//! - [`Gate::session`]: a signed-in session changing its own password: its
//!   pair passed this gate when the session opened.
//!
//! A single sign-on, or any later way in, calls the gate the same way; a
//! factor proved elsewhere (an identity provider's `amr` naming a one-time
//! code, with `trust_provider_mfa`) is one more kind of [`Verified`], made
//! here by the check that trusts it ([`check_provider_factor`]).
//!
//! Not through the gate, by design: the refresh endpoint renews a session
//! that exists, and the pair it renews was gated when the session opened
//! (ended sessions, outdated tokens and a disabled or locked user are
//! refused there); a public customer's public user has no account and no
//! second factor (the platform's public login has none either); a password
//! reset by mail answers no pair at all, so its holder logs in, through the
//! gate, afterwards.
//!
//! A `Cleared` cannot be made anywhere else:
//!
//! ```compile_fail
//! use keygate::auth::second_factor::Cleared;
//! fn forge(user: keygate::store::UserRecord) -> Cleared {
//!     Cleared { user }
//! }
//! ```

use std::hash::Hash;
use std::time::{Duration, Instant};

use crate::auth::at_rest::Sealer;
use crate::auth::jwt::{MFA_CONFIGURATION_SCOPE, PRE_VERIFICATION_SCOPE};
use crate::auth::totp;
use crate::config::EnforcedUsers;
use crate::error::ApiError;
use crate::identity::{Authority, Identity};
use crate::store::{Audit, Store, TwoFactorRecord, UserRecord};

pub const TOTP: &str = "TOTP";
pub const BACKUP_CODE: &str = "BACKUP_CODE";
pub const EMAIL: &str = "EMAIL";

/// Whether `provider` counts on its own: backup codes count only beside
/// another provider (they recover one, they are not one).
pub fn stands_alone(provider: &str) -> bool {
    provider != BACKUP_CODE
}

/// When a second factor is due: the providers the platform offers and whom
/// a second factor is enforced for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    offered: Vec<String>,
    enforced: Option<EnforcedUsers>,
}

impl Policy {
    /// `offered`: the provider types the settings in force offer;
    /// `enforced`: whom they enforce a second factor for, `None` when they
    /// enforce none.
    pub fn new(offered: impl IntoIterator<Item = String>, enforced: Option<EnforcedUsers>) -> Self {
        Policy {
            offered: offered.into_iter().collect(),
            enforced,
        }
    }

    /// The providers of `configured` that count: those offered, backup codes
    /// only beside another; one of them marked default when none is.
    pub fn counting(&self, mut configured: Vec<TwoFactorRecord>) -> Vec<TwoFactorRecord> {
        configured.retain(|r| self.offered.contains(&r.provider));
        if !configured.iter().any(|r| stands_alone(&r.provider)) {
            configured.clear();
        }
        if !configured.iter().any(|r| r.use_by_default)
            && let Some(first) = configured.iter_mut().find(|r| stands_alone(&r.provider))
        {
            first.use_by_default = true;
        }
        configured
    }

    /// Must `user` configure a second factor before a token pair?
    pub fn enforced_for(&self, user: &UserRecord) -> bool {
        match &self.enforced {
            None => false,
            Some(EnforcedUsers::AllUsers) => true,
            Some(EnforcedUsers::SystemAdministrators) => user.authority == Authority::SysAdmin,
            Some(EnforcedUsers::TenantAdministrators { tenants_ids, .. }) => {
                user.authority == Authority::TenantAdmin
                    && tenants_ids
                        .as_deref()
                        .is_none_or(|ids| ids.is_empty() || ids.contains(&user.tenant_id))
            }
        }
    }

    /// What is due for `user`, whose providers that count are `active`.
    pub fn due(&self, user: &UserRecord, active: &[TwoFactorRecord]) -> Option<Pending> {
        if !active.is_empty() {
            Some(Pending::Verify)
        } else if self.enforced_for(user) {
            Some(Pending::Configure)
        } else {
            None
        }
    }

    /// Whether `user` may remove `provider` from `active`: not the last one
    /// that stands alone while a second factor is enforced for them.
    pub fn may_remove(
        &self,
        user: &UserRecord,
        active: &[TwoFactorRecord],
        provider: &str,
    ) -> bool {
        !self.enforced_for(user)
            || active
                .iter()
                .any(|r| r.provider != provider && stands_alone(&r.provider))
    }
}

/// A login that waits for its second factor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pending {
    /// A code of a configured provider (a pre-verification token).
    Verify,
    /// A provider must be configured first (an MFA configuration token).
    Configure,
}

impl Pending {
    /// The scope of the token that waits.
    pub fn scope(self) -> &'static str {
        match self {
            Pending::Verify => PRE_VERIFICATION_SCOPE,
            Pending::Configure => MFA_CONFIGURATION_SCOPE,
        }
    }
}

/// A user who may have a token pair now: none is due, or it was passed.
/// Made only by [`Gate`]; not `Clone`: one pass, one pair.
#[derive(Debug)]
pub struct Cleared {
    user: UserRecord,
}

impl Cleared {
    pub fn user(&self) -> &UserRecord {
        &self.user
    }
}

/// A code checked right for a user, made only by this module's checks.
#[derive(Debug)]
pub struct Verified {
    user: UserRecord,
    codes_left: Option<usize>,
}

impl Verified {
    /// The backup codes left, after a backup code.
    pub fn codes_left(&self) -> Option<usize> {
        self.codes_left
    }
}

/// The gate: every way to a [`Cleared`].
pub struct Gate;

impl Gate {
    /// `user` under `policy`: cleared when none is due, else what is.
    pub async fn check(
        store: &Store,
        policy: &Policy,
        user: &UserRecord,
    ) -> Result<Result<Cleared, Pending>, ApiError> {
        let active = active(store, policy, user.id).await?;
        Ok(match policy.due(user, &active) {
            None => Ok(Cleared { user: user.clone() }),
            Some(pending) => Err(pending),
        })
    }

    /// The user a code was checked right for.
    pub fn passed(verified: Verified) -> Cleared {
        Cleared {
            user: verified.user,
        }
    }

    /// The holder of an MFA configuration token of `user`, once a provider
    /// that counts is configured; `None` while none is.
    pub async fn configured(
        store: &Store,
        policy: &Policy,
        user: &UserRecord,
    ) -> Result<Option<Cleared>, ApiError> {
        let active = active(store, policy, user.id).await?;
        Ok((!active.is_empty()).then(|| Cleared { user: user.clone() }))
    }

    /// `user` signed in by a session of their own (not an API key): that
    /// session's pair passed the gate when it opened.
    pub fn session(identity: &Identity, user: &UserRecord) -> Option<Cleared> {
        (identity.is_session() && identity.principal.user_id == user.id)
            .then(|| Cleared { user: user.clone() })
    }
}

/// A second factor an identity provider proved at a single sign-on of
/// `user`: counted only when `trusted_and_shown` (the provider's
/// `trust_provider_mfa` is on and its ID token's `amr` shows a factor
/// beyond a password, [`crate::sso::mapping::shows_second_factor`]).
pub fn check_provider_factor(user: &UserRecord, trusted_and_shown: bool) -> Option<Verified> {
    trusted_and_shown.then(|| Verified {
        user: user.clone(),
        codes_left: None,
    })
}

/// The providers of `user_id` that count under `policy`.
pub async fn active(
    store: &Store,
    policy: &Policy,
    user_id: uuid::Uuid,
) -> Result<Vec<TwoFactorRecord>, ApiError> {
    Ok(policy.counting(store.two_factors(user_id).await?))
}

fn audited_by_user(store: &Store, user: &UserRecord, action: &'static str) -> Store {
    store.audited(Audit::by_user(user.id, user.tenant_id, &user.email, action))
}

/// The TOTP code `code` of `record`, right and not used before.
pub async fn check_totp(
    store: &Store,
    sealer: &Sealer,
    user: &UserRecord,
    record: &TwoFactorRecord,
    code: &str,
) -> Result<Option<Verified>, ApiError> {
    let raw = sealer.open(user.id, TOTP, &record.secret).map_err(|error| {
        tracing::error!(user_id = %user.id, %error, "a TOTP secret does not open: is the encryption secret that sealed it still configured?");
        ApiError::internal()
    })?;
    let Some(step) = totp::matching_step(&raw, code, crate::clock::now_secs()) else {
        return Ok(None);
    };
    let resealed = if sealer.is_stale(&record.secret) {
        Some(
            sealer
                .seal(user.id, TOTP, &raw)
                .map_err(|_| ApiError::internal())?,
        )
    } else {
        None
    };
    let used = audited_by_user(store, user, "two_factor.use")
        .use_totp_step(user.id, step, resealed.as_deref())
        .await?;
    if !used {
        tracing::warn!(target: "keygate::security", user_id = %user.id, "refused a TOTP code used before");
        return Ok(None);
    }
    Ok(Some(Verified {
        user: user.clone(),
        codes_left: None,
    }))
}

/// The backup code `code`, one of the unused ones of `record`: used up.
pub async fn check_backup_code(
    store: &Store,
    sealer: &Sealer,
    user: &UserRecord,
    record: &TwoFactorRecord,
    code: &str,
) -> Result<Option<Verified>, ApiError> {
    let digests = code_digests(&record.secret);
    let mut matched = None;
    for (index, digest) in digests.iter().enumerate() {
        if sealer.code_matches(user.id, code, digest) && matched.is_none() {
            matched = Some(index);
        }
    }
    let Some(index) = matched else {
        return Ok(None);
    };
    let mut left = digests.clone();
    left.remove(index);
    let after = serde_json::to_string(&left).map_err(|_| ApiError::internal())?;
    let used = audited_by_user(store, user, "two_factor.backup_code_used")
        .use_backup_code(user.id, &record.secret, &after)
        .await?;
    if !used {
        // Another request used a code at the same moment: check again.
        return Ok(None);
    }
    tracing::info!(target: "keygate::security", user_id = %user.id, codes_left = left.len(), "backup code used");
    Ok(Some(Verified {
        user: user.clone(),
        codes_left: Some(left.len()),
    }))
}

/// The keyed digests of the backup codes stored in `stored`.
pub fn code_digests(stored: &str) -> Vec<String> {
    serde_json::from_str(stored).unwrap_or_default()
}

/// An e-mail code that was sent: its keyed digest (never the code), when,
/// and for how long it holds.
#[derive(Clone)]
pub struct SentCode {
    pub digest: String,
    pub sent: Instant,
    pub lifetime: Duration,
}

/// `code`, the unexpired code last mailed to `user` and kept in `codes`
/// under `key`: a right code is used up (of two checks at once, one takes it).
pub fn check_mailed_code<K>(
    codes: &moka::sync::Cache<K, SentCode>,
    key: K,
    sealer: &Sealer,
    user: &UserRecord,
    code: &str,
) -> Option<Verified>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    let sent = codes.get(&key)?;
    if sent.sent.elapsed() > sent.lifetime {
        codes.invalidate(&key);
        return None;
    }
    if !sealer.code_matches(user.id, code, &sent.digest) {
        return None;
    }
    codes.remove(&key)?;
    Some(Verified {
        user: user.clone(),
        codes_left: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{AuthMethod, Principal, id_header_value};
    use uuid::Uuid;

    fn record(provider: &str, use_by_default: bool) -> TwoFactorRecord {
        TwoFactorRecord {
            provider: provider.into(),
            use_by_default,
            secret: String::new(),
            last_step: 0,
        }
    }

    fn user(authority: Authority, tenant: u128) -> UserRecord {
        UserRecord {
            authority,
            tenant_id: Uuid::from_u128(tenant),
            ..UserRecord::test_user("u@example.com")
        }
    }

    fn policy(offered: &[&str], enforced: Option<EnforcedUsers>) -> Policy {
        Policy::new(offered.iter().map(|p| p.to_string()), enforced)
    }

    fn tenant_admins(ids: Option<Vec<u128>>) -> Option<EnforcedUsers> {
        Some(EnforcedUsers::TenantAdministrators {
            tenants_ids: ids.map(|ids| ids.into_iter().map(Uuid::from_u128).collect()),
            tenant_profiles_ids: None,
        })
    }

    #[test]
    fn only_offered_providers_count_and_backup_codes_only_beside_another() {
        let both = [TOTP, BACKUP_CODE];
        let cases: [(&[&str], &[&str], &[&str]); 7] = [
            // offered, configured, counting
            (&both, &[], &[]),
            (&both, &[TOTP], &[TOTP]),
            (&both, &[BACKUP_CODE], &[]),
            (&both, &[TOTP, BACKUP_CODE], &[TOTP, BACKUP_CODE]),
            (&[BACKUP_CODE], &[TOTP, BACKUP_CODE], &[]),
            (&[TOTP], &[TOTP, BACKUP_CODE], &[TOTP]),
            (&[TOTP, EMAIL], &[EMAIL, BACKUP_CODE], &[EMAIL]),
        ];
        for (offered, configured, counting) in cases {
            let configured = configured.iter().map(|p| record(p, false)).collect();
            let got: Vec<String> = policy(offered, None)
                .counting(configured)
                .into_iter()
                .map(|r| r.provider)
                .collect();
            assert_eq!(got, counting, "offered {offered:?}");
        }
    }

    #[test]
    fn the_first_provider_that_stands_alone_is_the_default_when_none_is() {
        let p = policy(&[TOTP, BACKUP_CODE, EMAIL], None);
        let counted = p.counting(vec![record(BACKUP_CODE, false), record(EMAIL, false)]);
        assert_eq!(
            counted.iter().map(|r| r.use_by_default).collect::<Vec<_>>(),
            [false, true]
        );
        let chosen = p.counting(vec![record(TOTP, false), record(EMAIL, true)]);
        assert_eq!(
            chosen.iter().map(|r| r.use_by_default).collect::<Vec<_>>(),
            [false, true]
        );
    }

    #[test]
    fn enforcement_names_whom_it_applies_to() {
        let sys = user(Authority::SysAdmin, 1);
        let admin_of_1 = user(Authority::TenantAdmin, 1);
        let admin_of_2 = user(Authority::TenantAdmin, 2);
        let customer = user(Authority::CustomerUser, 1);
        let cases = [
            (None, [false, false, false, false]),
            (Some(EnforcedUsers::AllUsers), [true, true, true, true]),
            (
                Some(EnforcedUsers::SystemAdministrators),
                [true, false, false, false],
            ),
            (tenant_admins(None), [false, true, true, false]),
            (tenant_admins(Some(vec![])), [false, true, true, false]),
            (tenant_admins(Some(vec![1])), [false, true, false, false]),
        ];
        for (enforced, expected) in cases {
            let p = policy(&[TOTP], enforced.clone());
            let got = [&sys, &admin_of_1, &admin_of_2, &customer].map(|u| p.enforced_for(u));
            assert_eq!(got, expected, "{enforced:?}");
        }
    }

    #[test]
    fn a_code_is_due_with_a_provider_and_configuring_one_when_enforced_without() {
        let u = user(Authority::TenantAdmin, 1);
        let totp = [record(TOTP, true)];
        let cases: [(Option<EnforcedUsers>, &[TwoFactorRecord], Option<Pending>); 4] = [
            (None, &[], None),
            (None, &totp, Some(Pending::Verify)),
            (Some(EnforcedUsers::AllUsers), &[], Some(Pending::Configure)),
            (Some(EnforcedUsers::AllUsers), &totp, Some(Pending::Verify)),
        ];
        for (enforced, active, due) in cases {
            assert_eq!(
                policy(&[TOTP], enforced.clone()).due(&u, active),
                due,
                "{enforced:?}"
            );
        }
        assert_eq!(Pending::Verify.scope(), PRE_VERIFICATION_SCOPE);
        assert_eq!(Pending::Configure.scope(), MFA_CONFIGURATION_SCOPE);
    }

    #[test]
    fn the_last_provider_that_stands_alone_stays_while_enforced() {
        let u = user(Authority::TenantAdmin, 1);
        let all = Some(EnforcedUsers::AllUsers);
        let totp_codes = [record(TOTP, true), record(BACKUP_CODE, false)];
        let totp_email = [record(TOTP, true), record(EMAIL, false)];
        let cases: [(Option<EnforcedUsers>, &[TwoFactorRecord], &str, bool); 5] = [
            (None, &totp_codes, TOTP, true),
            (all.clone(), &totp_codes, TOTP, false),
            (all.clone(), &totp_codes, BACKUP_CODE, true),
            (all.clone(), &totp_email, TOTP, true),
            (all, &[], TOTP, false),
        ];
        for (enforced, active, provider, may) in cases {
            let p = policy(&[TOTP, BACKUP_CODE, EMAIL], enforced);
            assert_eq!(p.may_remove(&u, active, provider), may, "{provider}");
        }
    }

    #[test]
    fn only_backup_codes_do_not_stand_alone() {
        let cases = [(TOTP, true), (EMAIL, true), (BACKUP_CODE, false)];
        for (provider, alone) in cases {
            assert_eq!(stands_alone(provider), alone, "{provider}");
        }
    }

    #[test]
    fn a_session_of_the_user_is_cleared_and_an_api_key_or_another_user_is_not() {
        let u = user(Authority::TenantAdmin, 1);
        let identity = |user_id: Uuid, method: AuthMethod| {
            let principal = std::sync::Arc::new(Principal::new(
                user_id,
                u.tenant_id,
                u.customer_id,
                u.authority,
                u.email.clone(),
            ));
            Identity::new(principal, method, id_header_value(&Uuid::from_u128(9)))
        };
        let session = AuthMethod::Jwt {
            session_id: Uuid::from_u128(7),
        };
        let key = AuthMethod::ApiKey {
            key_id: Uuid::from_u128(8),
        };
        let cleared = Gate::session(&identity(u.id, session), &u).expect("own session");
        assert_eq!(cleared.user().id, u.id);
        assert!(Gate::session(&identity(u.id, key), &u).is_none());
        assert!(Gate::session(&identity(Uuid::from_u128(3), session), &u).is_none());
    }
}
