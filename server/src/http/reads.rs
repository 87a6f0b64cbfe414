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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};

use super::AppState;
use crate::replica::ReadFrom;
use crate::store::Store;

/// The cookie holding the primary's log position after this browser's last change.
use super::cookies::WRITTEN_COOKIE;
pub const READ_FROM_HEADER: &str = "gpuledger-read-from";
pub const AS_OF_HEADER: &str = "gpuledger-figures-as-of";

/// The database a request reads its figures from.
#[derive(Clone)]
pub struct Reads {
    store: Arc<dyn Store>,
    from: ReadFrom,
    /// Whether the handler read through it: only then does the response say where it read
    /// (`/tokens` or a sign-in read the primary whatever was chosen).
    used: Arc<AtomicBool>,
}

impl std::fmt::Debug for Reads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reads").field("from", &self.from).finish()
    }
}

impl Reads {
    pub fn primary(store: Arc<dyn Store>) -> Self {
        Reads::new(store, ReadFrom::Primary)
    }

    fn new(store: Arc<dyn Store>, from: ReadFrom) -> Self {
        Reads {
            store,
            from,
            used: Arc::default(),
        }
    }

    pub fn store(&self) -> &dyn Store {
        self.used.store(true, Ordering::Relaxed);
        self.store.as_ref()
    }

    /// The store, for a task that outlives the handler (a streamed download).
    pub fn shared(&self) -> Arc<dyn Store> {
        self.used.store(true, Ordering::Relaxed);
        self.store.clone()
    }

    /// What a page says of its figures' freshness: nothing when they come from the primary,
    /// or when the page read none through it.
    pub fn freshness(&self) -> Option<String> {
        if !self.used.load(Ordering::Relaxed) {
            return None;
        }
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
/// was. A server without a replica reads the primary and says nothing. A GET whose read from
/// the replica failed (503: it went down, or cancelled the statement) is answered again from
/// the primary, and the replica is not read until the next poll finds it readable.
pub async fn route(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(replica) = state.replica.clone() else {
        return next.run(req).await;
    };
    let jar = CookieJar::from_headers(req.headers());
    let reading = matches!(*req.method(), Method::GET | Method::HEAD);
    let from = if reading {
        let written = jar
            .get(WRITTEN_COOKIE)
            .and_then(|c| c.value().parse::<i64>().ok());
        replica.read_from(written, crate::clock::now_ms())
    } else {
        ReadFrom::Primary
    };
    let person = jar.get(super::cookies::SESSION_COOKIE).is_some();
    let (mut response, used) = match from {
        ReadFrom::Replica { .. } => {
            // A GET has no body: what it needs to be asked again is its head.
            let again = copy_of(&req);
            let reads = Reads::new(replica.store().clone(), from);
            let (response, used) = run(next.clone(), req, reads).await;
            match again {
                Some(again) if response.status() == StatusCode::SERVICE_UNAVAILABLE => {
                    replica.failed("the database was unavailable");
                    let primary = Reads::primary(state.store.clone());
                    let (response, used) = run(next, again, primary).await;
                    (response, used.then_some(ReadFrom::Primary))
                }
                _ => (response, used.then_some(from)),
            }
        }
        ReadFrom::Primary => {
            let (response, used) = run(next, req, Reads::primary(state.store.clone())).await;
            (response, used.then_some(from))
        }
    };
    let headers = response.headers_mut();
    match used {
        None => {}
        Some(ReadFrom::Primary) => {
            headers.insert(READ_FROM_HEADER, HeaderValue::from_static("primary"));
        }
        Some(ReadFrom::Replica { as_of_ms }) => {
            headers.insert(READ_FROM_HEADER, HeaderValue::from_static("replica"));
            if let Ok(v) = HeaderValue::from_str(&crate::format::rfc3339_second(as_of_ms)) {
                headers.insert(AS_OF_HEADER, v);
            }
        }
    }
    // Agents' reports and API clients carry no session: only a person's change is followed.
    let changed = response.status().is_success() || response.status().is_redirection();
    if !reading && person && changed {
        follow_change(&state, &replica, &mut response).await;
    }
    response
}

/// Runs the handler reading through `reads`; answers whether it read through them.
async fn run(next: Next, mut req: Request, reads: Reads) -> (Response, bool) {
    let used = reads.used.clone();
    req.extensions_mut().insert(reads);
    let response = next.run(req).await;
    (response, used.load(Ordering::Relaxed))
}

/// A body-less request's copy (none where its head will not copy).
fn copy_of(req: &Request) -> Option<Request> {
    let mut copy = Request::builder()
        .method(req.method().clone())
        .uri(req.uri().clone())
        .version(req.version())
        .body(axum::body::Body::empty())
        .ok()?;
    *copy.headers_mut() = req.headers().clone();
    *copy.extensions_mut() = req.extensions().clone();
    Some(copy)
}

/// Keeps the primary's log position after a person's change in a cookie: their pages read the
/// primary until the replica has replayed it.
async fn follow_change(
    state: &AppState,
    replica: &crate::replica::Replica,
    response: &mut Response,
) {
    match replica.primary_position().await {
        Ok(Some(at)) => {
            // Past the replica's greatest lag it has replayed the change, or is not read at
            // all. Whole seconds, rounded up: a cookie of Max-Age 0 would be dropped at once.
            let max_age = replica.max_lag().as_millis().div_ceil(1000).max(1);
            let cookie = Cookie::build((WRITTEN_COOKIE, at.to_string()))
                .path("/")
                .http_only(true)
                .same_site(SameSite::Lax)
                .secure(state.secure_cookies)
                .max_age(cookie::time::Duration::seconds(
                    i64::try_from(max_age).unwrap_or(i64::MAX),
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use tower::ServiceExt;

    use super::*;
    use crate::test_support;

    /// A replica taken as current that then fails a read (it is down): the GET is answered from
    /// the primary, says so, and the replica is not read again until a poll finds it readable.
    #[tokio::test]
    async fn a_failed_read_from_the_replica_is_answered_from_the_primary() {
        let db = test_support::postgres().await;
        let primary = db.open().await;
        let down = crate::store::replica::ReplicaStore::connect(
            &format!("postgres://gpuledger@127.0.0.1:{}/none", closed_port()),
            primary.clone(),
        )
        .unwrap();
        let replica = Arc::new(crate::replica::Replica::new(
            Arc::new(down),
            primary.clone(),
            Duration::from_secs(30),
        ));
        let mut state = AppState::new(primary.clone());
        state.replica = Some(replica.clone());
        let app = crate::http::router(state);
        let secret = crate::read_tokens::create(
            primary.as_ref(),
            "bi",
            &gpuledger_core::scope::Scope::all(),
            "admin",
            crate::clock::now_ms(),
        )
        .await
        .unwrap();
        let get = |path: &str| {
            axum::http::Request::get(path)
                .header("authorization", format!("Bearer {secret}"))
                .body(Body::empty())
                .unwrap()
        };

        replica.assume_current(crate::clock::now_ms());
        assert!(matches!(
            replica.read_from(None, crate::clock::now_ms()),
            ReadFrom::Replica { .. }
        ));
        let resp = app
            .clone()
            .oneshot(get("/api/v1/allocation?by=team"))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()[READ_FROM_HEADER], "primary");
        assert!(resp.headers().get(AS_OF_HEADER).is_none());
        assert_eq!(
            replica.read_from(None, crate::clock::now_ms()),
            ReadFrom::Primary,
            "not read again until a poll finds it readable"
        );
        replica.poll(crate::clock::now_ms()).await;
        assert_eq!(
            replica.read_from(None, crate::clock::now_ms()),
            ReadFrom::Primary
        );
        assert!(replica
            .exposition(crate::clock::now_ms())
            .contains("gpuledger_read_replica_up 0"));

        // A GET that reads no figures (the health check) says nothing of where.
        let resp = app.oneshot(get("/healthz")).await.unwrap();
        assert!(resp.headers().get(READ_FROM_HEADER).is_none());
    }

    /// A port nothing listens on.
    fn closed_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    }
}
