use super::*;

#[tokio::test]
async fn users_and_sessions() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        crate::store::accounts::create_user(store.db(), "ana", "hash", "admin", None, T0)
            .await
            .unwrap();
        assert!(
            matches!(
                crate::store::accounts::create_user(store.db(), "ana", "h2", "viewer", None, T0)
                    .await,
                Err(StoreError::Conflict(_))
            ),
            "{b}"
        );
        let ana = crate::store::accounts::user_by_name(store.db(), "ana")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(ana.role, "admin", "{b}");
        assert!(
            crate::store::accounts::user_by_name(store.db(), "bob")
                .await
                .unwrap()
                .is_none(),
            "{b}"
        );
        crate::store::accounts::create_session(store.db(), "s1", ana.id, "csrf-1", T0, T0 + 1_000)
            .await
            .unwrap();
        let s = crate::store::accounts::session(store.db(), "s1", T0 + 10)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (s.username.as_str(), s.role.as_str(), s.csrf_token.as_str()),
            ("ana", "admin", "csrf-1"),
            "{b}"
        );
        assert!(
            crate::store::accounts::session(store.db(), "s1", T0 + 1_000)
                .await
                .unwrap()
                .is_none(),
            "{b}: expired"
        );
        crate::store::accounts::create_session(
            store.db(),
            "s2",
            ana.id,
            "csrf-2",
            T0 + 2_000,
            T0 + 5_000,
        )
        .await
        .unwrap();
        assert!(
            crate::store::accounts::session(store.db(), "s2", T0 + 2_001)
                .await
                .unwrap()
                .is_some(),
            "{b}"
        );
        crate::store::accounts::delete_session(store.db(), "s2")
            .await
            .unwrap();
        assert!(
            crate::store::accounts::session(store.db(), "s2", T0 + 2_002)
                .await
                .unwrap()
                .is_none(),
            "{b}: signed out"
        );
        assert_eq!(
            crate::store::accounts::list_users(store.db())
                .await
                .unwrap()
                .len(),
            1,
            "{b}"
        );
    }
}

#[test]
fn database_passwords_never_reach_logs() {
    use crate::store::redacted_url;
    assert_eq!(
        redacted_url("postgres://ledger:s3cret@db.internal:5432/gpuledger"),
        "postgres://ledger:***@db.internal:5432/gpuledger"
    );
    assert_eq!(
        redacted_url("postgresql://ledger@db/gl?sslmode=require&password=s3cret"),
        "postgresql://ledger@db/gl?sslmode=require&password=***"
    );
    assert_eq!(
        redacted_url("sqlite://gpuledger.db"),
        "sqlite://gpuledger.db"
    );
    assert_eq!(redacted_url("sqlite:data.db"), "sqlite:data.db");
}

#[tokio::test]
async fn a_users_teams_are_read_with_every_session() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        crate::store::accounts::create_user(
            store.db(),
            "vic",
            "hash",
            "viewer",
            Some(r#"["serving"]"#),
            T0,
        )
        .await
        .unwrap();
        let vic = crate::store::accounts::user_by_name(store.db(), "vic")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(vic.teams.as_deref(), Some(r#"["serving"]"#), "{b}");
        crate::store::accounts::create_session(store.db(), "s", vic.id, "c", T0, T0 + 1_000)
            .await
            .unwrap();
        let teams = |store: std::sync::Arc<dyn crate::store::Store>| async move {
            crate::store::accounts::session(store.db(), "s", T0 + 1)
                .await
                .unwrap()
                .unwrap()
                .teams
        };
        assert_eq!(
            teams(store.clone()).await.as_deref(),
            Some(r#"["serving"]"#),
            "{b}"
        );
        // A change of scope reaches sessions already open: it is read with each of them.
        assert!(
            crate::store::accounts::set_teams(store.db(), vic.id, None)
                .await
                .unwrap(),
            "{b}"
        );
        assert_eq!(teams(store.clone()).await, None, "{b}");
        assert!(
            !crate::store::accounts::set_teams(store.db(), vic.id + 99, Some("[]"))
                .await
                .unwrap(),
            "{b}: no such user"
        );
    }
}

#[tokio::test]
async fn provider_sign_ins_are_taken_once_and_never_take_over_a_local_name() {
    use crate::session::{sign_in_from_provider, AccountError, Role, SignIn};
    use crate::store::accounts::{put_oidc_login, take_oidc_login, OidcLogin};
    use gpuledger_core::scope::Scope;
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        let login = OidcLogin {
            verifier: "v".into(),
            nonce: "n".into(),
            next: "/budgets".into(),
        };
        put_oidc_login(store.db(), "s1", &login, T0, T0 - 600_000)
            .await
            .unwrap();
        put_oidc_login(store.db(), "old", &login, T0 - 700_000, T0 - 800_000)
            .await
            .unwrap();
        assert_eq!(
            take_oidc_login(store.db(), "s1", T0 - 600_000)
                .await
                .unwrap(),
            Some(login.clone()),
            "{b}"
        );
        assert_eq!(
            take_oidc_login(store.db(), "s1", T0 - 600_000)
                .await
                .unwrap(),
            None,
            "{b}: once"
        );
        assert_eq!(
            take_oidc_login(store.db(), "old", T0 - 600_000)
                .await
                .unwrap(),
            None,
            "{b}: expired"
        );

        // First sign-in adds the person, later ones set their role and teams from the groups.
        let serving = Scope::teams(["serving"]).unwrap();
        let subject = "https://idp#ana-1";
        sign_in_from_provider(store.as_ref(), subject, "ana", (Role::Viewer, &serving), T0)
            .await
            .unwrap();
        let ana = crate::store::accounts::oidc_user(store.db(), subject)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (ana.role.as_str(), ana.teams.as_deref()),
            ("viewer", Some(r#"["serving"]"#)),
            "{b}"
        );
        sign_in_from_provider(
            store.as_ref(),
            subject,
            "ana",
            (Role::Admin, &Scope::all()),
            T0,
        )
        .await
        .unwrap();
        let ana = crate::store::accounts::user_by_name(store.db(), "ana")
            .await
            .unwrap()
            .unwrap();
        assert_eq!((ana.role.as_str(), ana.teams), ("admin", None), "{b}");
        assert!(
            matches!(
                crate::session::set_teams(store.as_ref(), "ana", &serving).await,
                Err(AccountError::FromProvider(_))
            ),
            "{b}: the provider's groups say"
        );
        assert!(
            matches!(
                crate::session::set_password(store.as_ref(), "ana", "a long new password".into())
                    .await,
                Err(AccountError::FromProvider(_))
            ),
            "{b}: no password of ours for them"
        );
        // No password of ours signs them in.
        assert!(
            matches!(
                crate::session::sign_in(store.as_ref(), "ana", "!".into(), "c", T0).await,
                Ok(SignIn::Refused)
            ),
            "{b}"
        );
        // A local user's name is not the provider's to take: nothing is added.
        crate::store::accounts::create_user(store.db(), "lee", "hash", "viewer", None, T0)
            .await
            .unwrap();
        let taken = sign_in_from_provider(
            store.as_ref(),
            "https://idp#lee-9",
            "lee",
            (Role::Admin, &Scope::all()),
            T0,
        )
        .await;
        assert!(
            matches!(taken, Err(AccountError::NameTaken(_))),
            "{b}: {taken:?}"
        );
        let lee = crate::store::accounts::user_by_name(store.db(), "lee")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (lee.role.as_str(), lee.oidc_subject),
            ("viewer", None),
            "{b}"
        );
        let bad =
            sign_in_from_provider(store.as_ref(), "s#x", "a b", (Role::Viewer, &serving), T0).await;
        assert!(matches!(bad, Err(AccountError::BadName(_))), "{b}");
    }
}
