//! Dispatch: the one target of a normalised path.

use http::Method;

use crate::api::{self, Matched};
use crate::api_browser::ApiBrowser;
use crate::error::ApiError;
use crate::proxy::{Route, RouteTable};

/// What a request is for.
pub enum Target<'t> {
    /// The API browser (Swagger UI and its documents).
    ApiBrowser,
    /// An endpoint keygate answers itself.
    Endpoint(Matched),
    /// A route forwarded to an upstream.
    Proxied(&'t Route),
    /// A WebSocket upgrade on a platform WebSocket route (its label), to
    /// the upstream of the route it falls under.
    WebSocket(&'t Route, &'t str),
}

/// What dispatch reads besides the request: fixed at start, but the routes.
pub struct Tables<'t> {
    pub browser: bool,
    /// The route of the platform's user endpoints, when the sync is on.
    pub sync_upstream: Option<&'t str>,
    pub routes: &'t RouteTable,
    /// The platform WebSocket routes: one ending in `/` is a prefix.
    pub websocket_routes: &'t [String],
}

/// The one target of a normalised path, in this order: the API browser,
/// with the sync on the platform's user endpoints (to its route), keygate's
/// own endpoints (a 405 for one asked with another method), the proxied
/// routes (a 404 when none matches), where a WebSocket upgrade on a
/// platform WebSocket route is a target of its own.
pub fn dispatch<'t>(
    tables: &Tables<'t>,
    method: &Method,
    path: &str,
    upgrade: bool,
) -> Result<Target<'t>, ApiError> {
    if tables.browser && ApiBrowser::owns(path) {
        return Ok(Target::ApiBrowser);
    }
    if let Some(sync) = tables.sync_upstream
        && api::platform_owns(path)
    {
        // The platform owns user records: its route, its token.
        let route = tables
            .routes
            .named(sync)
            .ok_or_else(ApiError::unavailable)?;
        return Ok(Target::Proxied(route));
    }
    if let Some(matched) = api::find(method, path)? {
        return Ok(Target::Endpoint(matched));
    }
    let route = tables.routes.find(path).ok_or_else(ApiError::not_found)?;
    match websocket_route(tables.websocket_routes, path) {
        Some(label) if upgrade => Ok(Target::WebSocket(route, label)),
        _ => Ok(Target::Proxied(route)),
    }
}

/// The configured WebSocket route a normalised path falls under: an entry
/// ending in `/` is a prefix, any other an exact path.
pub fn websocket_route<'t>(routes: &'t [String], path: &str) -> Option<&'t str> {
    routes
        .iter()
        .find(|route| match route.strip_suffix('/') {
            Some(_) => path.starts_with(route.as_str()),
            None => path == route.as_str(),
        })
        .map(String::as_str)
}
