//! The platform's JSON record shapes, built from store records.

use serde_json::{Value, json};
use uuid::Uuid;

use crate::store::{ApiKeyRecord, UserRecord};

/// `{"entityType": ..., "id": ...}`, the platform's id object.
pub fn entity_id(entity_type: &str, id: Uuid) -> Value {
    json!({ "entityType": entity_type, "id": id })
}

/// The user record as `GET /api/auth/user` returns it.
pub fn user(user: &UserRecord) -> Value {
    let additional_info = user
        .additional_info
        .as_deref()
        .and_then(|text| serde_json::from_str::<Value>(text).ok())
        .unwrap_or(Value::Null);
    let optional = |s: &str| {
        if s.is_empty() {
            Value::Null
        } else {
            Value::String(s.to_string())
        }
    };
    json!({
        "id": entity_id("USER", user.id),
        "createdTime": user.created_time,
        "tenantId": entity_id("TENANT", user.tenant_id),
        "customerId": entity_id("CUSTOMER", user.customer_id),
        "email": user.email,
        "authority": user.authority.as_str(),
        "firstName": optional(&user.first_name),
        "lastName": optional(&user.last_name),
        "phone": optional(&user.phone),
        "version": user.version,
        "name": user.email,
        "additionalInfo": additional_info,
    })
}

/// The API key record; `value` only in the create response.
pub fn api_key(key: &ApiKeyRecord, value: Option<&str>) -> Value {
    let now = crate::clock::now_ms();
    let mut record = json!({
        "id": entity_id("API_KEY", key.id),
        "createdTime": key.created_time,
        "tenantId": entity_id("TENANT", key.tenant_id),
        "userId": entity_id("USER", key.user_id),
        "expirationTime": key.expiration_time,
        "description": key.description,
        "enabled": key.enabled,
        "expired": key.expiration_time != 0 && now >= key.expiration_time,
    });
    if let (Some(value), Some(map)) = (value, record.as_object_mut()) {
        map.insert("value".into(), Value::String(value.to_string()));
    }
    record
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{Authority, NULL_UUID};

    #[test]
    fn user_record_has_the_platform_shape() {
        let record = UserRecord {
            id: Uuid::from_u128(1),
            created_time: 1_700_000_000_000,
            tenant_id: Uuid::from_u128(2),
            customer_id: NULL_UUID,
            email: "t@example.com".into(),
            authority: Authority::TenantAdmin,
            first_name: "Tess".into(),
            last_name: String::new(),
            phone: String::new(),
            additional_info: Some(r#"{"lang":"en"}"#.into()),
            version: 3,
            enabled: true,
            password_hash: "$argon2id$secret".into(),
            tokens_valid_after: 0,
        };
        let json = user(&record);
        assert_eq!(
            json["id"],
            json!({"entityType": "USER", "id": Uuid::from_u128(1)})
        );
        assert_eq!(json["tenantId"]["entityType"], "TENANT");
        assert_eq!(json["customerId"]["id"], NULL_UUID.to_string());
        assert_eq!(json["createdTime"], 1_700_000_000_000_i64);
        assert_eq!(json["name"], "t@example.com");
        assert_eq!(json["firstName"], "Tess");
        assert_eq!(json["lastName"], Value::Null);
        assert_eq!(json["additionalInfo"]["lang"], "en");
        assert_eq!(json["version"], 3);
        assert!(
            !json.to_string().contains("argon2"),
            "never the password hash"
        );
    }
}
