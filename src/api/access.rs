//! Who may see and manage whom, paging parameters, and the audit log.

use serde_json::Value;
use uuid::Uuid;

use super::records::PageData;
use crate::error::ApiError;
use crate::identity::{Authority, Identity, Principal};
use crate::store::{Audit, Page, PageRequest, Sort, Store, UserRecord};

/// Largest page a listing returns.
pub const MAX_PAGE_SIZE: i64 = 1000;

/// May `actor` see `target` at all? Not visible answers 404, as if absent, so
/// an answer never tells that a user the caller may not see exists. A
/// CUSTOMER_USER sees only itself.
pub fn visible(actor: &Principal, target: &UserRecord) -> bool {
    match actor.authority {
        Authority::SysAdmin => true,
        Authority::TenantAdmin => target.tenant_id == actor.tenant_id,
        Authority::CustomerUser => target.id == actor.user_id,
    }
}

/// May `actor` manage `target` (and their keys)? A user manages themselves; a
/// TENANT_ADMIN the users of their tenant (never a SYS_ADMIN); a SYS_ADMIN all.
pub fn may_manage(actor: &Principal, target: &UserRecord) -> bool {
    if actor.user_id == target.id {
        return true;
    }
    match actor.authority {
        Authority::SysAdmin => true,
        Authority::TenantAdmin => {
            target.tenant_id == actor.tenant_id && target.authority != Authority::SysAdmin
        }
        Authority::CustomerUser => false,
    }
}

/// The access check of a user-addressed operation: 404 when not visible, 403
/// when visible but not manageable.
pub fn check_manage(actor: &Principal, target: Option<&UserRecord>) -> Result<(), ApiError> {
    match target {
        Some(user) if may_manage(actor, user) => Ok(()),
        Some(user) if visible(actor, user) => Err(ApiError::permission_denied()),
        _ => Err(ApiError::not_found()),
    }
}

/// Decodes `application/x-www-form-urlencoded` query pairs.
pub fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    query
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let escaped = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match escaped {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The first value of a query parameter.
pub fn param<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// `pageSize` (1..=1000), `page` (from 0), optional `textSearch`, and
/// optional `sortProperty` with `sortOrder` (`ASC`, the default, or `DESC`,
/// in any case, as the platform reads it). Which properties a listing sorts
/// by is its own check ([`check_sort`]).
pub fn page_request(query: Option<&str>) -> Result<PageRequest, ApiError> {
    let pairs = query_pairs(query);
    let number = |name: &str, min: i64, max: i64| -> Result<i64, ApiError> {
        let text = param(&pairs, name).ok_or_else(|| {
            ApiError::bad_request(format!(
                "Required request parameter '{name}' is not present"
            ))
        })?;
        match text.parse::<i64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(ApiError::bad_request(format!(
                "Parameter '{name}' must be an integer from {min} to {max}"
            ))),
        }
    };
    Ok(PageRequest {
        page_size: number("pageSize", 1, MAX_PAGE_SIZE)?,
        page: number("page", 0, i64::from(i32::MAX))?,
        text_search: param(&pairs, "textSearch")
            .map(str::to_owned)
            .filter(|t| !t.is_empty()),
        sort: sort(&pairs)?,
    })
}

fn sort(pairs: &[(String, String)]) -> Result<Option<Sort>, ApiError> {
    let Some(property) = param(pairs, "sortProperty").filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let descending = match param(pairs, "sortOrder").unwrap_or_default() {
        "" => false,
        order if order.eq_ignore_ascii_case("ASC") => false,
        order if order.eq_ignore_ascii_case("DESC") => true,
        order => {
            return Err(ApiError::bad_request(format!(
                "Unsupported sort order '{order}'! Only 'ASC' or 'DESC' types are allowed."
            )));
        }
    };
    Ok(Some(Sort {
        property: property.to_owned(),
        descending,
    }))
}

/// Refuses a `sortProperty` a listing cannot order by, as the platform
/// refuses one.
pub fn check_sort(page: &PageRequest, properties: &[(&str, &str)]) -> Result<(), ApiError> {
    match &page.sort {
        Some(sort) if !properties.iter().any(|(name, _)| *name == sort.property) => {
            Err(ApiError::bad_request("Invalid sort property"))
        }
        _ => Ok(()),
    }
}

/// The platform's page shape.
pub fn page_json<T, I: serde::Serialize>(
    page: &Page<T>,
    request: &PageRequest,
    item: impl Fn(&T) -> I,
) -> Value {
    serde_json::to_value(PageData::of(page, request, item)).unwrap_or(Value::Null)
}

/// Parses a path id.
pub fn path_id(text: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(text).map_err(|_| ApiError::bad_request(format!("Invalid UUID string: {text}")))
}

/// The store, recording `action` by `actor` with the change made through it
/// (stored with the change, and logged once committed).
pub fn audited(store: &Store, actor: &Identity, action: &'static str) -> Store {
    store.audited(Audit::by(&actor.principal, action))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::NULL_UUID;
    use serde_json::json;

    fn user(id: u128, tenant: u128, authority: Authority) -> UserRecord {
        UserRecord {
            id: Uuid::from_u128(id),
            tenant_id: if tenant == 0 {
                NULL_UUID
            } else {
                Uuid::from_u128(tenant)
            },
            authority,
            ..UserRecord::test_user(&format!("{id}@example.com"))
        }
    }

    fn principal(u: &UserRecord) -> Principal {
        Principal::new(
            u.id,
            u.tenant_id,
            u.customer_id,
            u.authority,
            u.email.clone(),
        )
    }

    #[test]
    fn authority_matrix() {
        let sys = user(1, 0, Authority::SysAdmin);
        let admin_a = user(2, 10, Authority::TenantAdmin);
        let customer_a = user(3, 10, Authority::CustomerUser);
        let other_customer_a = user(4, 10, Authority::CustomerUser);
        let admin_b = user(5, 20, Authority::TenantAdmin);
        // own
        for u in [&sys, &admin_a, &customer_a] {
            assert!(check_manage(&principal(u), Some(u)).is_ok());
        }
        // same tenant
        assert!(check_manage(&principal(&admin_a), Some(&customer_a)).is_ok());
        // A CUSTOMER_USER sees only itself: others of its tenant are "not found".
        assert_eq!(
            check_manage(&principal(&customer_a), Some(&other_customer_a)),
            Err(ApiError::not_found())
        );
        assert_eq!(
            check_manage(&principal(&customer_a), Some(&admin_a)),
            Err(ApiError::not_found())
        );
        // other tenant
        assert_eq!(
            check_manage(&principal(&admin_b), Some(&customer_a)),
            Err(ApiError::not_found())
        );
        // SYS_ADMIN
        assert!(check_manage(&principal(&sys), Some(&admin_b)).is_ok());
        assert_eq!(
            check_manage(&principal(&admin_a), Some(&sys)),
            Err(ApiError::not_found())
        );
        assert_eq!(
            check_manage(&principal(&admin_a), None),
            Err(ApiError::not_found())
        );
    }

    #[test]
    fn paging_parameters_are_checked_and_decoded() {
        let page = page_request(Some("pageSize=10&page=2&textSearch=a%20b+c")).unwrap();
        assert_eq!(
            page,
            PageRequest {
                page_size: 10,
                page: 2,
                text_search: Some("a b c".into()),
                sort: None,
            }
        );
        let sorted =
            page_request(Some("pageSize=1&page=0&sortProperty=email&sortOrder=desc")).unwrap();
        assert_eq!(
            sorted.sort,
            Some(Sort {
                property: "email".into(),
                descending: true
            })
        );
        let ascending = page_request(Some("pageSize=1&page=0&sortProperty=email")).unwrap();
        assert_eq!(ascending.sort.map(|s| s.descending), Some(false));
        let unsorted = page_request(Some("pageSize=1&page=0&sortOrder=DESC")).unwrap();
        assert_eq!(
            unsorted.sort, None,
            "an order without a property sorts nothing"
        );
        let bad =
            page_request(Some("pageSize=1&page=0&sortProperty=email&sortOrder=UP")).unwrap_err();
        assert!(
            bad.message.contains("Unsupported sort order 'UP'"),
            "{}",
            bad.message
        );
        let users = [("email", "email")];
        assert!(check_sort(&sorted, &users).is_ok());
        let password = page_request(Some("pageSize=1&page=0&sortProperty=password_hash")).unwrap();
        assert_eq!(
            check_sort(&password, &users).unwrap_err().message,
            "Invalid sort property"
        );
        assert!(
            page_request(Some("page=0"))
                .unwrap_err()
                .message
                .contains("pageSize")
        );
        assert!(page_request(Some("pageSize=0&page=0")).is_err());
        assert!(page_request(Some("pageSize=10&page=-1")).is_err());
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz%4"), "%zz%4");
    }

    #[test]
    fn page_json_has_the_platform_shape() {
        let page = Page {
            data: vec![1, 2],
            total: 5,
        };
        let request = PageRequest {
            page_size: 2,
            page: 1,
            text_search: None,
            sort: None,
        };
        let json = page_json(&page, &request, |n| json!(n));
        assert_eq!(
            json,
            json!({"data": [1, 2], "totalPages": 3, "totalElements": 5, "hasNext": true})
        );
    }
}
