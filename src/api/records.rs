//! The platform's record shapes, built from store records: each one type that
//! serialises and describes itself in the OpenAPI document.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, Type};
use utoipa::openapi::{KnownFormat, Ref, RefOr, SchemaFormat};
use utoipa::{PartialSchema, ToSchema};
use uuid::Uuid;

use crate::store::{ApiKeyRecord, Page, PageRequest, UserRecord};

/// `{"entityType": ..., "id": ...}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", from = "IdOnly")]
pub struct EntityId {
    #[schema(example = "USER")]
    pub entity_type: String,
    pub id: Uuid,
}

/// What a request's id object must carry: the id (the type is implied by
/// the field, so `entityType` is not required).
#[derive(Deserialize)]
struct IdOnly {
    id: Uuid,
}

impl From<IdOnly> for EntityId {
    fn from(only: IdOnly) -> EntityId {
        EntityId {
            entity_type: String::new(),
            id: only.id,
        }
    }
}

impl EntityId {
    pub fn new(entity_type: &'static str, id: Uuid) -> EntityId {
        EntityId {
            entity_type: entity_type.to_string(),
            id,
        }
    }
}

/// One grant of a scoped API key: a request is allowed when its method is
/// listed (`HEAD` comes with `GET`) and its normalised path is `path` or lies
/// below it at a segment boundary (`/api/device` holds `/api/device/x`, never
/// `/api/devices`; a path ending in `/` holds only what is below it; `/`
/// holds every path).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ScopeGrant {
    #[schema(example = "/api/device/")]
    pub path: String,
    /// GET, HEAD, POST, PUT, PATCH, DELETE or OPTIONS.
    #[schema(example = json!(["GET", "POST"]))]
    pub methods: Vec<String>,
}

// The user record as `GET /api/auth/user` returns it (a doc comment would
// show in the document).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct User {
    pub id: EntityId,
    pub created_time: i64,
    pub tenant_id: EntityId,
    pub customer_id: EntityId,
    pub email: String,
    #[schema(example = "TENANT_ADMIN")]
    pub authority: String,
    pub first_name: Option<String>,
    pub last_name: Option<String>,
    pub phone: Option<String>,
    pub version: i64,
    pub name: String,
    pub additional_info: Option<Value>,
}

/// The state of a user's credentials, in `additionalInfo` as the platform's
/// `GET /api/user/{id}` puts it there: `userCredentialsEnabled` (false while
/// an invitation is pending and for a disabled user) and `userActivated`
/// (false while an invitation is pending). Always computed, over whatever
/// the stored info holds: a stale stored value never shows a pending or
/// disabled user as enabled.
fn additional_info(user: &UserRecord) -> Value {
    let mut info = match user
        .additional_info
        .as_deref()
        .and_then(|text| serde_json::from_str::<Value>(text).ok())
    {
        Some(Value::Object(info)) => info,
        _ => serde_json::Map::new(),
    };
    info.insert(
        "userCredentialsEnabled".into(),
        Value::Bool(user.credentials_enabled()),
    );
    info.insert("userActivated".into(), Value::Bool(user.activated()));
    Value::Object(info)
}

impl From<&UserRecord> for User {
    fn from(user: &UserRecord) -> User {
        let optional = |s: &str| (!s.is_empty()).then(|| s.to_string());
        User {
            id: EntityId::new("USER", user.id),
            created_time: user.created_time,
            tenant_id: EntityId::new("TENANT", user.tenant_id),
            customer_id: EntityId::new("CUSTOMER", user.customer_id),
            email: user.email.clone(),
            authority: user.authority.as_str().to_string(),
            first_name: optional(&user.first_name),
            last_name: optional(&user.last_name),
            phone: optional(&user.phone),
            version: user.version,
            name: user.email.clone(),
            additional_info: Some(additional_info(user)),
        }
    }
}

// A user record with its owner, as the user-info listings return it: the
// owner is the customer for a customer's user, else the tenant. keygate
// holds no titles, so `ownerName` is null, and no entity groups.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserInfo {
    #[serde(flatten)]
    pub user: User,
    pub owner_id: EntityId,
    pub owner_name: Option<String>,
    pub groups: Vec<EntityId>,
}

impl From<&UserRecord> for UserInfo {
    fn from(user: &UserRecord) -> UserInfo {
        let owner_id = if user.customer_id == crate::identity::NULL_UUID {
            EntityId::new("TENANT", user.tenant_id)
        } else {
            EntityId::new("CUSTOMER", user.customer_id)
        };
        UserInfo {
            user: User::from(user),
            owner_id,
            owner_name: None,
            groups: Vec::new(),
        }
    }
}

impl User {
    /// The record of a public customer's public user, as its token names it.
    pub fn public(p: &crate::identity::Principal) -> User {
        User {
            id: EntityId::new("USER", p.user_id),
            created_time: 0,
            tenant_id: EntityId::new("TENANT", p.tenant_id),
            customer_id: EntityId::new("CUSTOMER", p.customer_id),
            email: p.email.clone(),
            authority: p.authority.as_str().to_string(),
            first_name: p.first_name.clone(),
            last_name: p.last_name.clone(),
            phone: None,
            version: 0,
            name: p.email.clone(),
            additional_info: None,
        }
    }
}

// The API key record; `value` only in the create response.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiKey {
    pub id: EntityId,
    pub created_time: i64,
    pub tenant_id: EntityId,
    pub user_id: EntityId,
    /// Epoch ms; 0 means never.
    pub expiration_time: i64,
    pub description: String,
    pub enabled: bool,
    pub expired: bool,
    /// The grants a scoped key is limited to; absent for a key with its
    /// owner's full rights.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<ScopeGrant>>, example = json!([
        {"path": "/api/device/", "methods": ["GET", "POST"]}
    ]))]
    pub scopes: Option<std::sync::Arc<crate::auth::scope::Scopes>>,
    /// Only in the create response.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

impl ApiKey {
    pub fn new(key: &ApiKeyRecord, value: Option<&str>) -> ApiKey {
        let now = crate::clock::now_ms();
        ApiKey {
            id: EntityId::new("API_KEY", key.id),
            created_time: key.created_time,
            tenant_id: EntityId::new("TENANT", key.tenant_id),
            user_id: EntityId::new("USER", key.user_id),
            expiration_time: key.expiration_time,
            description: key.description.clone(),
            enabled: key.enabled,
            expired: key.expiration_time != 0 && now >= key.expiration_time,
            scopes: key.scopes.clone(),
            value: value.map(str::to_string),
        }
    }
}

/// One page of a listing.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PageData<T> {
    pub data: Vec<T>,
    pub total_pages: i64,
    pub total_elements: i64,
    pub has_next: bool,
}

impl<T> PageData<T> {
    /// The page `request` asked for, of `page`'s items made into `T`.
    pub fn of<R>(page: &Page<R>, request: &PageRequest, item: impl Fn(&R) -> T) -> PageData<T> {
        PageData {
            data: page.data.iter().map(item).collect(),
            total_pages: (page.total + request.page_size - 1) / request.page_size,
            total_elements: page.total,
            has_next: (request.page + 1) * request.page_size < page.total,
        }
    }
}

/// The page schema of `T`, named `PageData<T's name>` as clients know it.
fn page_schema<T: ToSchema>() -> RefOr<Schema> {
    let int64 = || {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
    };
    ObjectBuilder::new()
        .property(
            "data",
            ArrayBuilder::new().items(Ref::from_schema_name(T::name())),
        )
        .required("data")
        .property("totalPages", int64())
        .required("totalPages")
        .property("totalElements", int64())
        .required("totalElements")
        .property("hasNext", ObjectBuilder::new().schema_type(Type::Boolean))
        .required("hasNext")
        .into()
}

macro_rules! page_schemas {
    ($($item:ty => $name:literal),+) => {
        $(
            impl PartialSchema for PageData<$item> {
                fn schema() -> RefOr<Schema> {
                    page_schema::<$item>()
                }
            }

            impl ToSchema for PageData<$item> {
                fn name() -> Cow<'static, str> {
                    Cow::Borrowed($name)
                }
            }
        )+
    };
}

page_schemas!(ApiKey => "PageDataApiKey", User => "PageDataUser", UserInfo => "PageDataUserInfo");

/// A page of API key records, as the document names it.
pub type PageDataApiKey = PageData<ApiKey>;
/// A page of user records, as the document names it.
pub type PageDataUser = PageData<User>;
/// A page of user records with their owners, as the document names it.
pub type PageDataUserInfo = PageData<UserInfo>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::NULL_UUID;
    use serde_json::json;

    #[test]
    fn user_record_has_the_platform_shape() {
        let record = UserRecord {
            id: Uuid::from_u128(1),
            created_time: 1_700_000_000_000,
            tenant_id: Uuid::from_u128(2),
            first_name: "Tess".into(),
            additional_info: Some(r#"{"lang":"en"}"#.into()),
            version: 3,
            password_hash: "$argon2id$secret".into(),
            ..UserRecord::test_user("t@example.com")
        };
        let json = serde_json::to_value(User::from(&record)).unwrap();
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

    #[test]
    fn a_pending_invitation_is_shown_as_the_platform_shows_it_never_as_enabled() {
        let state = |user: &UserRecord| {
            let json = serde_json::to_value(User::from(user)).unwrap();
            (
                json["additionalInfo"]["userCredentialsEnabled"].clone(),
                json["additionalInfo"]["userActivated"].clone(),
            )
        };
        // Stored info from an older platform said enabled: never believed.
        let pending = UserRecord {
            additional_info: Some(r#"{"userCredentialsEnabled":true,"lang":"de"}"#.into()),
            ..UserRecord::test_user("invited@example.com")
        };
        assert_eq!(state(&pending), (json!(false), json!(false)));
        let json = serde_json::to_value(User::from(&pending)).unwrap();
        assert_eq!(json["additionalInfo"]["lang"], "de", "the rest is kept");
        let active = UserRecord {
            password_hash: "$argon2id$hash".into(),
            ..pending.clone()
        };
        assert_eq!(state(&active), (json!(true), json!(true)));
        let disabled = UserRecord {
            enabled: false,
            ..active.clone()
        };
        assert_eq!(state(&disabled), (json!(false), json!(true)));
        let no_info = UserRecord {
            additional_info: Some("null".into()),
            ..active
        };
        assert_eq!(state(&no_info), (json!(true), json!(true)));
    }

    #[test]
    fn user_info_names_the_customer_or_else_the_tenant_as_owner() {
        let tenant_user = UserRecord {
            tenant_id: Uuid::from_u128(2),
            ..UserRecord::test_user("t@example.com")
        };
        let json = serde_json::to_value(UserInfo::from(&tenant_user)).unwrap();
        assert_eq!(
            json["ownerId"],
            json!({"entityType": "TENANT", "id": Uuid::from_u128(2)})
        );
        assert_eq!(json["email"], "t@example.com", "the user's own fields");
        assert_eq!(json["groups"], json!([]));
        assert_eq!(json["ownerName"], Value::Null);
        let customer_user = UserRecord {
            customer_id: Uuid::from_u128(3),
            authority: crate::identity::Authority::CustomerUser,
            ..tenant_user
        };
        let json = serde_json::to_value(UserInfo::from(&customer_user)).unwrap();
        assert_eq!(json["ownerId"]["entityType"], "CUSTOMER");
        assert_eq!(json["ownerId"]["id"], Uuid::from_u128(3).to_string());
    }
}
