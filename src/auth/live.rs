//! Credentials held open by long-lived connections (WebSockets): who holds
//! them, how many each user and tenant holds, and the wake-up that makes a
//! holder check its credential again when a revocation may have ended it.
//!
//! A revocation passes the revocation path (`auth::revocation`), which drops the cache
//! entries first and then calls [`LiveCredentials::revoked`]: a woken holder
//! verifies again through the caches and so reads the store's new state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;
use uuid::Uuid;

use crate::identity::{AuthMethod, Identity, NULL_UUID};
use crate::store::Revocation;

/// Holders per user and per tenant; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HoldLimits {
    pub per_user: Option<usize>,
    pub per_tenant: Option<usize>,
}

/// Holders per user and per tenant: `(id, count)` pairs.
pub type Counts = (Vec<(Uuid, usize)>, Vec<(Uuid, usize)>);

/// Which limit refused a new holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverLimit {
    User,
    Tenant,
}

#[derive(Default)]
pub struct LiveCredentials {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    holders: HashMap<u64, Holder>,
    per_user: HashMap<Uuid, usize>,
    per_tenant: HashMap<Uuid, usize>,
}

struct Holder {
    user_id: Uuid,
    tenant_id: Uuid,
    method: AuthMethod,
    wake: Arc<Notify>,
}

impl Holder {
    fn affected_by(&self, revocation: &Revocation) -> bool {
        match (*revocation, self.method) {
            (Revocation::User(id), _) => id == self.user_id,
            (Revocation::Key(id), AuthMethod::ApiKey { key_id }) => id == key_id,
            (Revocation::Session(id), AuthMethod::Jwt { session_id }) => id == session_id,
            _ => false,
        }
    }
}

/// One held credential; dropping it lets go.
pub struct Held {
    registry: Arc<LiveCredentials>,
    id: u64,
    wake: Arc<Notify>,
}

impl Held {
    /// Completes when a revocation may have ended the credential (at once if
    /// one came since the last wake-up).
    pub async fn woken(&self) {
        self.wake.notified().await;
    }
}

impl Held {
    /// Lets go now, before the value is dropped (dropping it then does
    /// nothing more).
    pub fn release(&self) {
        self.registry.release(self.id);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.registry.release(self.id);
    }
}

impl LiveCredentials {
    /// Holds `identity`'s credential, unless its user or tenant already holds
    /// as many as `limits` allow. The platform's "no tenant" (a system
    /// administrator) has no tenant limit.
    pub fn hold(
        self: &Arc<Self>,
        identity: &Identity,
        limits: HoldLimits,
    ) -> Result<Held, OverLimit> {
        let user_id = identity.principal.counted_as();
        let tenant_id = identity.principal.tenant_id;
        let mut inner = self.lock();
        let users = inner.per_user.get(&user_id).copied().unwrap_or(0);
        if limits.per_user.is_some_and(|max| users >= max) {
            return Err(OverLimit::User);
        }
        let tenants = inner.per_tenant.get(&tenant_id).copied().unwrap_or(0);
        if tenant_id != NULL_UUID && limits.per_tenant.is_some_and(|max| tenants >= max) {
            return Err(OverLimit::Tenant);
        }
        *inner.per_user.entry(user_id).or_default() += 1;
        *inner.per_tenant.entry(tenant_id).or_default() += 1;
        inner.next += 1;
        let id = inner.next;
        let wake = Arc::new(Notify::new());
        inner.holders.insert(
            id,
            Holder {
                user_id,
                tenant_id,
                method: identity.method,
                wake: wake.clone(),
            },
        );
        Ok(Held {
            registry: self.clone(),
            id,
            wake,
        })
    }

    /// Wakes every holder whose credential the revocation may have ended.
    pub fn revoked(&self, revocation: &Revocation) {
        for holder in self.lock().holders.values() {
            if holder.affected_by(revocation) {
                holder.wake.notify_one();
            }
        }
    }

    /// Wakes every holder (the caches were flushed: anything may have changed).
    pub fn wake_all(&self) {
        for holder in self.lock().holders.values() {
            holder.wake.notify_one();
        }
    }

    /// How many credentials a user and a tenant hold now.
    pub fn held_by(&self, user: Uuid, tenant: Uuid) -> (usize, usize) {
        let inner = self.lock();
        (
            inner.per_user.get(&user).copied().unwrap_or(0),
            inner.per_tenant.get(&tenant).copied().unwrap_or(0),
        )
    }

    /// How many credentials each user and each tenant holds now.
    pub fn counts(&self) -> Counts {
        let inner = self.lock();
        let listed = |counts: &HashMap<Uuid, usize>| {
            counts.iter().map(|(id, count)| (*id, *count)).collect()
        };
        (listed(&inner.per_user), listed(&inner.per_tenant))
    }

    /// Credentials held now.
    pub fn len(&self) -> usize {
        self.lock().holders.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn release(&self, id: u64) {
        let mut inner = self.lock();
        let Some(holder) = inner.holders.remove(&id) else {
            return;
        };
        decrement(&mut inner.per_user, holder.user_id);
        decrement(&mut inner.per_tenant, holder.tenant_id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn decrement(counts: &mut HashMap<Uuid, usize>, id: Uuid) {
    if let Some(count) = counts.get_mut(&id) {
        *count -= 1;
        if *count == 0 {
            counts.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{Authority, Principal, id_header_value};
    use std::time::Duration;

    fn identity(user: u128, tenant: u128, method: AuthMethod) -> Identity {
        let principal = Arc::new(Principal::new(
            Uuid::from_u128(user),
            Uuid::from_u128(tenant),
            NULL_UUID,
            Authority::TenantAdmin,
            "u@example.com".into(),
        ));
        Identity::new(principal, method, id_header_value(&Uuid::from_u128(9)))
    }

    fn key(id: u128) -> AuthMethod {
        AuthMethod::ApiKey {
            key_id: Uuid::from_u128(id),
        }
    }

    fn session(id: u128) -> AuthMethod {
        AuthMethod::Jwt {
            session_id: Uuid::from_u128(id),
        }
    }

    async fn was_woken(held: &Held) -> bool {
        tokio::time::timeout(Duration::from_millis(20), held.woken())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_revocation_wakes_only_the_holders_it_names() {
        let live = Arc::new(LiveCredentials::default());
        let none = HoldLimits::default();
        let by_key = live.hold(&identity(1, 2, key(10)), none).unwrap();
        let by_session = live.hold(&identity(1, 2, session(20)), none).unwrap();
        let other = live.hold(&identity(3, 2, key(30)), none).unwrap();

        live.revoked(&Revocation::Key(Uuid::from_u128(10)));
        assert!(was_woken(&by_key).await);
        assert!(!was_woken(&by_session).await);
        assert!(!was_woken(&other).await);

        live.revoked(&Revocation::Session(Uuid::from_u128(20)));
        assert!(was_woken(&by_session).await);
        assert!(!was_woken(&by_key).await);

        live.revoked(&Revocation::User(Uuid::from_u128(1)));
        assert!(was_woken(&by_key).await);
        assert!(was_woken(&by_session).await);
        assert!(!was_woken(&other).await);

        live.wake_all();
        assert!(was_woken(&other).await);
    }

    #[test]
    fn limits_count_per_user_and_per_tenant_and_free_on_drop() {
        let live = Arc::new(LiveCredentials::default());
        let limits = HoldLimits {
            per_user: Some(2),
            per_tenant: Some(3),
        };
        let a = live.hold(&identity(1, 7, key(1)), limits).unwrap();
        let _b = live.hold(&identity(1, 7, key(1)), limits).unwrap();
        assert_eq!(
            live.hold(&identity(1, 7, key(1)), limits).err(),
            Some(OverLimit::User)
        );
        let _c = live.hold(&identity(2, 7, key(2)), limits).unwrap();
        assert_eq!(
            live.hold(&identity(3, 7, key(3)), limits).err(),
            Some(OverLimit::Tenant)
        );
        drop(a);
        let _d = live.hold(&identity(1, 7, key(1)), limits).unwrap();
        assert_eq!(live.len(), 3);
    }

    #[test]
    fn system_administrators_have_no_tenant_limit() {
        let live = Arc::new(LiveCredentials::default());
        let limits = HoldLimits {
            per_user: None,
            per_tenant: Some(1),
        };
        let null_tenant = NULL_UUID.as_u128();
        let _a = live
            .hold(&identity(1, null_tenant, key(1)), limits)
            .unwrap();
        assert!(live.hold(&identity(2, null_tenant, key(2)), limits).is_ok());
    }

    #[test]
    fn counts_follow_holds_and_releases() {
        let live = Arc::new(LiveCredentials::default());
        let (alice, bob) = (identity(1, 7, key(1)), identity(2, 7, session(2)));
        let first = live.hold(&alice, HoldLimits::default()).unwrap();
        let _second = live.hold(&alice, HoldLimits::default()).unwrap();
        let _third = live.hold(&bob, HoldLimits::default()).unwrap();
        assert_eq!(live.held_by(Uuid::from_u128(1), Uuid::from_u128(7)), (2, 3));
        first.release();
        assert_eq!(live.held_by(Uuid::from_u128(1), Uuid::from_u128(7)), (1, 2));
        drop(first);
        let (mut users, tenants) = live.counts();
        users.sort();
        assert_eq!(
            users,
            vec![(Uuid::from_u128(1), 1), (Uuid::from_u128(2), 1)]
        );
        assert_eq!(tenants, vec![(Uuid::from_u128(7), 2)]);
    }
}
