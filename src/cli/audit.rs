//! `keygate audit`: the latest audit events, newest first, filtered.

use keygate::config::Settings;
use keygate::store::AuditFilter;

use super::{AuditArgs, open_store, time};

pub(super) async fn audit(args: AuditArgs, settings: &Settings) -> anyhow::Result<()> {
    let since = match &args.since {
        Some(text) => {
            Some(time::parse_since(text, keygate::clock::now_ms()).map_err(anyhow::Error::msg)?)
        }
        None => None,
    };
    let store = open_store(settings).await?;
    // A user is matched as actor by email, and as target by id while the
    // user exists (a deleted user's events name them as actor only).
    let user_id = match &args.user {
        Some(email) => store.user_by_email(email).await?.map(|u| u.id),
        None => None,
    };
    let filter = AuditFilter {
        since_ms: since,
        action: args.action.clone(),
        user_email: args.user.clone(),
        user_id,
    };
    let events = store.audit_events_where(&filter, args.limit).await?;
    if !args.json {
        println!(
            "{:<23}  {:<19}  {:<30}  {:<7}  TARGET",
            "TIME", "ACTION", "ACTOR", "TYPE"
        );
    }
    for event in events {
        if args.json {
            let mut line = serde_json::json!({
                "id": event.id,
                "createdTime": event.created_time,
                "actorId": event.actor_id,
                "actor": event.actor,
                "tenantId": event.tenant_id,
                "action": event.action,
                "targetType": event.target_type,
                "targetId": event.target_id,
            });
            // Only a key created scoped has them: every other line is as before.
            if let Some(scopes) = event.scopes.as_deref() {
                line["scopes"] = serde_json::from_str(scopes).unwrap_or_default();
            }
            println!("{line}");
        } else {
            let scopes = event
                .scopes
                .as_deref()
                .map(|scopes| format!("  scopes {scopes}"))
                .unwrap_or_default();
            println!(
                "{:<23}  {:<19}  {:<30}  {:<7}  {}{scopes}",
                time::readable(event.created_time),
                event.action,
                event.actor,
                event.target_type,
                event.target_id
            );
        }
    }
    Ok(())
}
