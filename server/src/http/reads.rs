//! Which database a request reads its figures from, decided once per request here (see
//! `crate::replica`): the read replica for a GET when it is current enough, else the primary.
//! Handlers read through [`Reads`] (carried by `SignedIn`); sign-in, sessions and tokens
//! always read the primary, so signing in never waits on a replica.
//!
//! After a person changes something (any successful non-GET with a session), the primary's log
//! position is kept in a short cookie, and their GETs read the primary until the replica has
//! replayed it: the page a form redirects to shows the change. Every response to a server with
//! a replica says where it read (`Gpuledger-Read-From`) and, from the replica, as of when
//! (`Gpuledger-Figures-As-Of`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};

use super::AppState;
use crate::replica::ReadFrom;
use crate::store::Store;

/// The cookie holding the primary's log position after this browser's last change.
pub const WRITTEN_COOKIE: &str = "gpl_written";
pub const READ_FROM_HEADER: &str = "gpuledger-read-from";
pub const AS_OF_HEADER: &str = "gpuledger-figures-as-of";

/// The database a request reads its figures from.
#[derive(Clone)]
pub struct Reads {
    store: Arc<dyn Store>,
    from: ReadFrom,
}

impl std::fmt::Debug for Reads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reads").field("from", &self.from).finish()
    }
}

impl Reads {
    pub fn primary(store: Arc<dyn Store>) -> Self {
        Reads {
            store,
            from: ReadFrom::Primary,
        }
    }

    pub fn store(&self) -> &dyn Store {
        self.store.as_ref()
    }

    /// The store, for a task that outlives the handler (a streamed download).
    pub fn shared(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// What a page says of its figures' freshness: nothing when they come from the primary.
    pub fn freshness(&self) -> Option<String> {
        match self.from {
            ReadFrom::Primary => None,
            ReadFrom::Replica { as_of_ms } => Some(format!(
                "Figures as of {} (read replica)",
                crate::format::utc_second(as_of_ms)
            )),
        }
    }

    /// Those a request made before this layer ran (a test's router without it): the primary.
    pub fn of(parts: &axum::http::request::Parts, state: &AppState) -> Self {
        parts
            .extensions
            .get::<Reads>()
            .cloned()
            .unwrap_or_else(|| Reads::primary(state.store.clone()))
    }
}

/// The layer: picks the request's [`Reads`], and after a change keeps where the primary's log
/// was. A server without a replica reads the primary and says nothing.
pub async fn route(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let Some(replica) = state.replica.clone() else {
        return next.run(req).await;
    };
    let jar = CookieJar::from_headers(req.headers());
    let reading = matches!(*req.method(), Method::GET | Method::HEAD);
    let from = if reading {
        let written = jar
            .get(WRITTEN_COOKIE)
            .and_then(|c| c.value().parse::<i64>().ok());
        replica.read_from(written, crate::now_ms())
    } else {
        ReadFrom::Primary
    };
    let store = match from {
        ReadFrom::Primary => state.store.clone(),
        ReadFrom::Replica { .. } => replica.store().clone(),
    };
    req.extensions_mut().insert(Reads { store, from });
    let person = jar.get(super::session::SESSION_COOKIE).is_some();
    let mut response = next.run(req).await;
    let headers = response.headers_mut();
    match from {
        ReadFrom::Primary => {
            headers.insert(READ_FROM_HEADER, HeaderValue::from_static("primary"));
        }
        ReadFrom::Replica { as_of_ms } => {
            headers.insert(READ_FROM_HEADER, HeaderValue::from_static("replica"));
            if let Ok(v) = HeaderValue::from_str(&crate::format::rfc3339_second(as_of_ms)) {
                headers.insert(AS_OF_HEADER, v);
            }
        }
    }
    // Agents' reports and API clients carry no session: only a person's change is followed.
    let changed = response.status().is_success() || response.status().is_redirection();
    if !reading && person && changed {
        match replica.primary_position().await {
            Ok(Some(at)) => {
                let cookie = Cookie::build((WRITTEN_COOKIE, at.to_string()))
                    .path("/")
                    .http_only(true)
                    .same_site(SameSite::Lax)
                    .secure(state.secure_cookies)
                    // Past the replica's greatest lag it has replayed the change, or is not
                    // read at all.
                    .max_age(cookie::time::Duration::seconds(
                        replica.max_lag().as_secs().try_into().unwrap_or(i64::MAX),
                    ))
                    .build();
                if let Ok(v) = HeaderValue::from_str(&cookie.to_string()) {
                    response
                        .headers_mut()
                        .append(axum::http::header::SET_COOKIE, v);
                }
            }
            Ok(None) => {}
            // Without it the next page may read the replica from before the change; said, not
            // failed, since the change itself was made.
            Err(e) => tracing::warn!(error = %e, "the primary's log position after a change"),
        }
    }
    response
}
