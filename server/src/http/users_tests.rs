//! People through the pages: admins add, remove and set passwords (sessions end at once, the
//! last admin stays), everybody changes their own password; bad input says why and changes
//! nothing; on both backends.

use axum::http::StatusCode;

use super::tests::apis;
use crate::clock::now_ms;
use crate::session::{sign_in, AccountError, SignIn};

/// Signs `name` in with `password`; the session's cookie, or `None` where refused.
async fn signed_in(api: &super::tests::Api, name: &str, password: &str) -> Option<String> {
    match sign_in(api.store.as_ref(), name, password.into(), "test", now_ms())
        .await
        .unwrap()
    {
        SignIn::Started { token } => Some(format!("gpl_session={token}")),
        _ => None,
    }
}

/// The CSRF token of the session behind `cookie`.
async fn csrf_of(api: &super::tests::Api, cookie: &str) -> String {
    crate::store::accounts::session(
        api.store.db(),
        &crate::auth::hash_token(cookie.trim_start_matches("gpl_session=")),
        now_ms(),
    )
    .await
    .unwrap()
    .unwrap()
    .csrf_token
}

async fn works(api: &super::tests::Api, cookie: &str) -> bool {
    api.get_as("/account", Some(cookie)).await.0 == StatusCode::OK
}

#[tokio::test]
async fn admins_manage_people_and_everybody_their_own_password() {
    for (api, _db) in apis().await {
        let b = api.backend;
        let (admin, csrf) = api.session("admin").await;
        let form = |fields: &[(&str, &str)]| {
            let mut f = format!("csrf={csrf}");
            for (k, v) in fields {
                f.push_str(&format!("&{k}={}", urlencoding(v)));
            }
            f
        };
        let add = |name: &'static str, role: &'static str, password: &'static str| {
            form(&[("username", name), ("role", role), ("password", password)])
        };
        let (status, _, page) = api
            .post_form(
                "/users",
                &admin,
                &add("dana", "viewer", "dana's long secret"),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{b}: {page}");
        assert!(page.contains("dana added as viewer"), "{b}");
        for (body, why) in [
            (
                add("two words", "viewer", "long enough pw"),
                "not a user name",
            ),
            (add("eve", "owner", "long enough pw"), "not a role"),
            (add("eve", "viewer", "short"), "at least 10"),
            (add("dana", "viewer", "long enough pw"), "already"),
        ] {
            let (status, _, page) = api.post_form("/users", &admin, &body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{b}: {why}");
            assert!(
                page.contains("Nothing was changed") && page.contains(why),
                "{b}: {why}: {page}"
            );
        }
        let users = crate::store::accounts::list_users(api.store.db())
            .await
            .unwrap();
        assert_eq!(users.len(), 2, "{b}: admin-user and dana only");

        // An admin sets dana's password: her session ends, the new password signs in.
        let dana = signed_in(&api, "dana", "dana's long secret").await.unwrap();
        assert!(works(&api, &dana).await, "{b}");
        let (status, _, _) = api
            .post_form(
                "/users/password",
                &admin,
                &form(&[("username", "dana"), ("password", "set by the admin")]),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        assert!(!works(&api, &dana).await, "{b}: her session ended");
        assert!(
            signed_in(&api, "dana", "dana's long secret")
                .await
                .is_none(),
            "{b}"
        );

        // Dana changes her own: the current one first, the new one twice; her other session
        // ends, this one goes on.
        let here = signed_in(&api, "dana", "set by the admin").await.unwrap();
        let elsewhere = signed_in(&api, "dana", "set by the admin").await.unwrap();
        let dana_csrf = csrf_of(&api, &here).await;
        let change = |current: &str, new: &str, repeat: &str| {
            format!(
                "csrf={dana_csrf}&current={}&new={}&repeat={}",
                urlencoding(current),
                urlencoding(new),
                urlencoding(repeat)
            )
        };
        for (body, why) in [
            (
                change("wrong one here", "dana's own secret", "dana's own secret"),
                "not right",
            ),
            (
                change("set by the admin", "dana's own secret", "dana's own secreT"),
                "differ",
            ),
            (change("set by the admin", "short", "short"), "at least 10"),
        ] {
            let (status, _, page) = api.post_form("/account/password", &here, &body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{b}: {why}");
            assert!(page.contains(why), "{b}: {why}: {page}");
        }
        assert!(works(&api, &elsewhere).await, "{b}: nothing changed yet");
        let (status, headers, page) = api
            .post_form(
                "/account/password",
                &here,
                &change("set by the admin", "dana's own secret", "dana's own secret"),
            )
            .await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{b}: {page}");
        let fresh = headers["set-cookie"]
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_owned();
        assert!(
            works(&api, &fresh).await,
            "{b}: a new session, in the answer's cookie"
        );
        assert!(
            !works(&api, &here).await && !works(&api, &elsewhere).await,
            "{b}: every old session ended, the one it was changed from too"
        );
        assert!(
            signed_in(&api, "dana", "set by the admin").await.is_none(),
            "{b}"
        );
        assert!(
            signed_in(&api, "dana", "dana's own secret").await.is_some(),
            "{b}"
        );
        // Guessing the current password from a session counts as failed sign-ins: after five,
        // even the right one waits.
        let fresh_csrf = csrf_of(&api, &fresh).await;
        let guess = |current: &str| {
            format!(
                "csrf={fresh_csrf}&current={}&new=another+long+one&repeat=another+long+one",
                urlencoding(current)
            )
        };
        for i in 0..5 {
            let (status, _, page) = api
                .post_form(
                    "/account/password",
                    &fresh,
                    &guess(&format!("guess number {i}")),
                )
                .await;
            assert!(
                status == StatusCode::BAD_REQUEST && page.contains("not right"),
                "{b}: {i}"
            );
        }
        let (status, _, page) = api
            .post_form("/account/password", &fresh, &guess("dana's own secret"))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{b}");
        assert!(page.contains("too many"), "{b}: {page}");
        let here = fresh;
        // Her read-only tokens go with her.
        crate::read_tokens::create(
            api.store.as_ref(),
            "dana-bi",
            &gpuledger_core::scope::Scope::all(),
            "dana",
            now_ms(),
        )
        .await
        .unwrap();

        // Removed: her sessions end at once. The last admin stays.
        let (status, _, _) = api
            .post_form("/users/remove", &admin, &form(&[("username", "dana")]))
            .await;
        assert_eq!(status, StatusCode::OK, "{b}");
        assert!(!works(&api, &here).await, "{b}");
        let tokens = crate::read_tokens::list(api.store.as_ref()).await.unwrap();
        assert!(tokens[0].revoked_ms.is_some(), "{b}: {tokens:?}");
        let (status, _, page) = api
            .post_form(
                "/users/remove",
                &admin,
                &form(&[("username", "admin-user")]),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{b}");
        assert!(page.contains("last admin"), "{b}: {page}");
        let (status, _, page) = api
            .post_form("/users/remove", &admin, &form(&[("username", "nobody")]))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{b}");
        assert!(page.contains("no user"), "{b}: {page}");

        // Two admins removing each other at once leave one.
        let store = api.store.as_ref();
        crate::session::add_user(
            store,
            "ops",
            "admin",
            &gpuledger_core::scope::Scope::all(),
            "ops long secret".into(),
            now_ms(),
        )
        .await
        .unwrap();
        let (one, other) = tokio::join!(
            crate::session::remove_user(store, "admin-user", now_ms()),
            crate::session::remove_user(store, "ops", now_ms())
        );
        let refused = [&one, &other]
            .iter()
            .filter(|r| matches!(r, Err(AccountError::LastAdmin(_))))
            .count();
        assert_eq!(
            (one.is_ok() as usize + other.is_ok() as usize, refused),
            (1, 1),
            "{b}: {one:?} {other:?}"
        );
        assert_eq!(
            crate::store::accounts::admin_count(store.db())
                .await
                .unwrap(),
            1,
            "{b}"
        );
    }
}

fn urlencoding(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}
