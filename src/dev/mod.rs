//! `keygate serve --dev`: keygate on its embedded defaults with the reference
//! entity service behind it, for trying keygate in one command.
//!
//! The reference service runs in the same process on a free loopback port; the
//! `/api/` and public `/api/noauth/` routes point at it and its OpenAPI document
//! is joined into the API browser's. After start, a development tenant
//! administrator gets a fresh API key (valid for a day) and the console says
//! what to do next: where the API browser is, which CA to trust, and a curl
//! that goes through to the upstream with that key. Never for production: the
//! upstream keeps its data in memory and the key is printed.

mod reference;
mod standalone;
mod verifier;

/// The reference entity service ([`reference`]): serves `listener` until
/// `shutdown`. Used by `serve --dev`, `keygate reference-upstream` (and the
/// `entity_service` example) and the tests; it is a demonstration upstream, not part of the gateway.
pub use reference::serve as serve_reference_upstream;
/// [`serve_reference_upstream`], verifying keygate's identity assertion on
/// every `/api/` request, as an upstream of an `identity = "assertion"`
/// route should ([`AssertionCheck`]).
pub use reference::serve_verifying as serve_reference_upstream_verifying;
/// [`serve_reference_upstream`], counting what tests must show never
/// reached it.
pub use reference::{
    Counters as ReferenceCounters, serve_counted as serve_reference_upstream_counted,
};
pub use standalone::{ReferenceUpstreamArgs, run_reference_upstream, terminated};
pub use verifier::AssertionCheck;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::net::TcpListener;
use uuid::Uuid;

use crate::accounts::{self, AccountError, NewProfile, NewUser};
use crate::config::{RouteSpec, Settings, UpstreamUrl};
use crate::identity::Authority;
use crate::server::Running;
use crate::store::{Audit, Store};

/// The development tenant administrator the quick-start key belongs to.
pub const DEV_TENANT_ADMIN: &str = "tenant@keygate.local";
/// The development tenant's id (fixed, so data stays findable across restarts).
pub const DEV_TENANT: Uuid = Uuid::from_u128(0x6b657967_6174_4564_8576_74656e616e74);
/// How long the quick-start key works.
const KEY_LIFETIME: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, thiserror::Error)]
pub enum DevError {
    #[error("starting the reference entity service")]
    Upstream(#[source] std::io::Error),
    #[error("preparing the development tenant administrator")]
    Account(#[from] AccountError),
    #[error("opening the store")]
    Store(#[from] crate::store::StoreError),
}

/// Starts the reference entity service on a free loopback port and routes
/// `/api/` and `/api/noauth/` to it, its OpenAPI document joined. Returns its
/// address; it runs until the process ends.
pub async fn start_reference(settings: &mut Settings) -> Result<SocketAddr, DevError> {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(DevError::Upstream)?;
    let addr = listener.local_addr().map_err(DevError::Upstream)?;
    tokio::spawn(reference::serve(listener, std::future::pending()));
    let upstream: UpstreamUrl = format!("http://{addr}")
        .parse()
        .expect("a socket address makes a URI");
    let route = |name: &str, prefix: &str, public: bool, openapi: bool| RouteSpec {
        name: name.into(),
        prefix: prefix.into(),
        upstreams: vec![upstream.clone()],
        public,
        request_timeout: settings.proxy.request_timeout,
        openapi: openapi.then(|| {
            format!("http://{addr}/v3/api-docs")
                .parse()
                .expect("a socket address makes a URI")
        }),
        quota: Default::default(),
        identity: Default::default(),
        audience: name.into(),
        upstream_tls: None,
    };
    settings.routes = vec![
        route("api", "/api/", false, true),
        route("noauth", "/api/noauth/", true, false),
    ];
    Ok(addr)
}

/// Creates the development tenant administrator when missing (no password:
/// it works through API keys) and a fresh API key for it.
async fn quick_start_key(store: &Store, prefix: &str) -> Result<String, DevError> {
    let user = match store.user_by_email(DEV_TENANT_ADMIN).await? {
        Some(user) => user,
        None => {
            let new = NewUser {
                email: DEV_TENANT_ADMIN.into(),
                authority: Authority::TenantAdmin,
                tenant_id: Some(DEV_TENANT),
                customer_id: None,
                first_name: "Development".into(),
                last_name: "Tenant".into(),
            };
            match accounts::create_pending_user(store, new, NewProfile::default()).await {
                Ok(user) => user,
                // Created by another start at the same moment.
                Err(AccountError::Exists(_)) => store
                    .user_by_email(DEV_TENANT_ADMIN)
                    .await?
                    .ok_or_else(|| AccountError::Invalid("the development user vanished".into()))?,
                Err(e) => return Err(e.into()),
            }
        }
    };
    let expires = crate::clock::now_ms() + KEY_LIFETIME.as_millis() as i64;
    let key = accounts::create_api_key(
        &store.audited(Audit::command_line("api_key.create")),
        &user,
        prefix,
        "keygate serve --dev quick start",
        expires,
        true,
    )
    .await?;
    Ok(key.value.expose().to_string())
}

/// What to do next, for the console: the API browser, the CA to trust, the
/// administrator, and curls through to the upstream with a fresh key.
pub async fn quick_start(running: &Running, settings: &Settings) -> Result<String, DevError> {
    let key = quick_start_key(&running.store, &settings.api_key_prefix).await?;
    let base = match running.https {
        Some(addr) => format!("https://localhost:{}", addr.port()),
        None => format!(
            "http://127.0.0.1:{}",
            running.http.map_or(8080, |a| a.port())
        ),
    };
    let ca_file = crate::tls::dev_paths(&settings.data_dir).0;
    let cacert = match (&running.https, &settings.tls_files) {
        (Some(_), None) => format!("--cacert {} ", shell_path(&ca_file)),
        _ => String::new(),
    };
    let mut out = String::new();
    out.push_str(
        "\nkeygate is running in development mode, in front of the reference entity service.\n\n",
    );
    out.push_str(&format!("  API browser     {base}/swagger-ui.html\n"));
    if !cacert.is_empty() {
        out.push_str(&format!(
            "  trust this CA   {} (a development CA made on first start)\n",
            ca_file.display()
        ));
    }
    out.push_str(&format!(
        "  administrator   {} (password: printed on the first start, or KEYGATE_BOOTSTRAP_PASSWORD)\n",
        accounts::BOOTSTRAP_EMAIL
    ));
    if let Some(admin) = running.admin {
        out.push_str(&format!("  metrics         http://{admin}/metrics\n"));
    }
    out.push_str(&format!(
        "\nA fresh API key of {DEV_TENANT_ADMIN}, valid for a day. Create a device, then list them:\n\n"
    ));
    out.push_str(&format!(
        "  curl {cacert}-H 'X-Authorization: ApiKey {key}' -H 'Content-Type: application/json' \\\n       -d '{{\"name\":\"Thermostat A\"}}' {base}/api/device\n"
    ));
    out.push_str(&format!(
        "  curl {cacert}-H 'X-Authorization: ApiKey {key}' '{base}/api/tenant/devices?pageSize=10&page=0'\n"
    ));
    out.push_str(
        "\nStop with Ctrl-C. For production, run `keygate serve --config FILE` (see docs/deploying.md).\n",
    );
    Ok(out)
}

/// A path as it can be pasted into a shell (quoted when it needs to be).
fn shell_path(path: &Path) -> String {
    let text = path.display().to_string();
    if text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b))
    {
        text
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_quoted_for_the_shell_only_when_needed() {
        assert_eq!(shell_path(Path::new("data/dev-ca.pem")), "data/dev-ca.pem");
        assert_eq!(
            shell_path(Path::new("my data/it's.pem")),
            r"'my data/it'\''s.pem'"
        );
    }
}
