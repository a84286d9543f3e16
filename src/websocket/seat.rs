//! A socket's seat among its user's and tenant's open sockets: held in this
//! replica's credential registry ([`crate::auth::live`]) and, with Redis,
//! counted with the other replicas' ([`crate::shared_limits::seats`]).

use std::sync::Arc;

use uuid::Uuid;

use crate::auth::live::{Held, HoldLimits, LiveCredentials, OverLimit};
use crate::identity::{Identity, NULL_UUID};
use crate::shared_limits::seats::{Full, Owner, Seats};

/// An open socket's seat; dropping it frees the seat here and, with Redis,
/// publishes the new counts for the other replicas.
pub struct Seat {
    held: Held,
    shared: Option<Across>,
}

/// What a seat holds across replicas (with Redis): its place in the shared
/// counts, and what the counts are kept for.
struct Across {
    seats: Arc<Seats>,
    live: Arc<LiveCredentials>,
    user: Uuid,
    tenant: Option<Uuid>,
}

/// The platform's "no tenant" (a system administrator) has no tenant count.
fn tenant_of(identity: &Identity) -> Option<Uuid> {
    let tenant = identity.principal.tenant_id;
    (tenant != NULL_UUID).then_some(tenant)
}

impl Seat {
    /// Takes a seat for `identity`: within the limits on this replica, then
    /// across replicas when `seats` shares them.
    pub async fn take(
        live: &Arc<LiveCredentials>,
        seats: Option<&Arc<Seats>>,
        identity: &Identity,
        limits: HoldLimits,
    ) -> Result<Seat, OverLimit> {
        let held = live.hold(identity, limits)?;
        let Some(seats) = seats else {
            return Ok(Seat { held, shared: None });
        };
        let (user, tenant) = (identity.principal.counted_as(), tenant_of(identity));
        let (users, tenants) = live.held_by(user, identity.principal.tenant_id);
        // Made before asking, so that a refusal frees this replica's count
        // (and publishes it) like any close.
        let seat = Seat {
            held,
            shared: Some(Across {
                seats: seats.clone(),
                live: live.clone(),
                user,
                tenant,
            }),
        };
        match seats.admit(user, users, tenant, tenants).await {
            Ok(()) => Ok(seat),
            Err(Full::User) => Err(OverLimit::User),
            Err(Full::Tenant) => Err(OverLimit::Tenant),
        }
    }

    /// The held credential, which revocations wake.
    pub fn held(&self) -> &Held {
        &self.held
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let Some(shared) = &self.shared else {
            return;
        };
        // Freed here first, so the counts published are those without it.
        self.held.release();
        let tenant_id = shared.tenant.unwrap_or(NULL_UUID);
        let (users, tenants) = shared.live.held_by(shared.user, tenant_id);
        shared.seats.left(
            (shared.user, users),
            shared.tenant.map(|tenant| (tenant, tenants)),
        );
    }
}

/// This replica's counts of open sockets, per user and per tenant, as the
/// shared limits publish them.
pub fn seats_held(live: &LiveCredentials) -> Vec<(Owner, usize)> {
    let (users, tenants) = live.counts();
    users
        .into_iter()
        .map(|(id, count)| (Owner::User(id), count))
        .chain(
            tenants
                .into_iter()
                .filter(|(id, _)| *id != NULL_UUID)
                .map(|(id, count)| (Owner::Tenant(id), count)),
        )
        .collect()
}
