use super::*;

#[tokio::test]
async fn users_and_sessions() {
    for db in test_support::both().await {
        let store = db.open().await;
        let b = db.backend;
        crate::store::accounts::create_user(store.db(), "ana", "hash", "admin", T0)
            .await
            .unwrap();
        assert!(
            matches!(
                crate::store::accounts::create_user(store.db(), "ana", "h2", "viewer", T0).await,
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
