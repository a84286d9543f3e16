//! `keygate audit`: the latest audit events, one JSON object per line.

use keygate::config::Settings;

use super::open_store;

pub(super) async fn audit(limit: u32, settings: &Settings) -> anyhow::Result<()> {
    let store = open_store(settings).await?;
    for event in store.audit_events(limit).await? {
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
    }
    Ok(())
}
