//! Single sign-on through an OpenID Connect provider: the authorization code flow with PKCE
//! (the `openidconnect` crate). The ID token's signature (against the keys the provider
//! publishes), issuer, audience, expiry and nonce are checked before anything is stored; the
//! groups claim gives the person's role and teams at every sign-in ([`access_of`]). A provider
//! that is down or answers wrongly stops only this way in: local users still sign in with their
//! passwords. Nothing of HTTP here: `http::login` starts and finishes it.

use std::collections::HashMap;
use std::time::Duration;

use openidconnect::core::{
    CoreAuthDisplay, CoreAuthPrompt, CoreErrorResponseType, CoreGenderClaim, CoreJsonWebKey,
    CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm, CoreProviderMetadata,
    CoreResponseType, CoreRevocableToken, CoreRevocationErrorResponse,
    CoreTokenIntrospectionResponse, CoreTokenType,
};
use openidconnect::{
    AdditionalClaims, AuthenticationFlow, AuthorizationCode, Client, ClientId, ClientSecret,
    CsrfToken, EmptyExtraTokenFields, EndpointMaybeSet, EndpointNotSet, EndpointSet, IdTokenFields,
    IssuerUrl, Nonce, OAuth2TokenResponse, PkceCodeChallenge, PkceCodeVerifier, RedirectUrl,
    StandardErrorResponse, StandardTokenResponse, TokenResponse,
};
use serde::{Deserialize, Serialize};

use crate::auth::hash_token;
use crate::config::OidcConfig;
use crate::session::{AccountError, Role};
use crate::store::accounts::OidcLogin;
use crate::store::{self, Store, StoreError};
use gpuledger_core::scope::Scope;

/// How long a person may take at the provider before the sign-in must start again.
pub const LOGIN_TTL_MS: i64 = 10 * 60 * 1000;
/// Where the client secret is read when the config file leaves it out.
pub const SECRET_ENV: &str = "GPULEDGER_OIDC_CLIENT_SECRET";

/// Every claim beyond the standard ones, by name: the groups claim is whichever the config
/// names.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProviderClaims {
    #[serde(flatten)]
    other: HashMap<String, serde_json::Value>,
}

impl AdditionalClaims for ProviderClaims {}

impl ProviderClaims {
    /// The claim's strings: a list of them, or one alone; `None` where the claim is absent.
    fn strings(&self, name: &str) -> Option<Vec<String>> {
        match self.other.get(name)? {
            serde_json::Value::Array(items) => Some(
                items
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect(),
            ),
            serde_json::Value::String(one) => Some(vec![one.clone()]),
            _ => Some(Vec::new()),
        }
    }
}

type ProviderIdTokenFields = IdTokenFields<
    ProviderClaims,
    EmptyExtraTokenFields,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm,
>;
type ProviderTokenResponse = StandardTokenResponse<ProviderIdTokenFields, CoreTokenType>;
/// A client of the provider as discovery describes it: an authorization endpoint always, a
/// token and user-info endpoint where it names them.
type ProviderClient = Client<
    ProviderClaims,
    CoreAuthDisplay,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJsonWebKey,
    CoreAuthPrompt,
    StandardErrorResponse<CoreErrorResponseType>,
    ProviderTokenResponse,
    CoreTokenIntrospectionResponse,
    CoreRevocableToken,
    CoreRevocationErrorResponse,
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
>;

/// Why single sign-on did not sign somebody in. Nothing was stored in any case.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    #[error("single sign-on is not set up on this server")]
    NotConfigured,
    /// The provider could not be reached, or its discovery document or keys are unusable.
    #[error("the sign-in provider is unavailable: {0}")]
    Unavailable(String),
    /// What the provider answered does not hold (a bad signature, a wrong nonce or issuer).
    #[error("the sign-in provider's answer was refused: {0}")]
    Refused(String),
    /// The provider said no (the person cancelled, or it refused them).
    #[error("the sign-in provider did not sign you in: {0}")]
    Denied(String),
    /// No sign-in under way for this browser: too old, already used, or begun elsewhere.
    #[error("this sign-in has expired or did not start in this browser: start again")]
    Expired,
    /// The person is in none of the groups that give access.
    #[error("{0}")]
    NoAccess(String),
    #[error(transparent)]
    Account(#[from] AccountError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The role and teams the provider's groups give: an admin group makes an admin, a viewer group
/// a viewer of every team, team groups a viewer of those teams; `None` for none of them.
pub fn access_of(c: &OidcConfig, groups: &[String]) -> Option<(Role, Scope)> {
    let member = |list: &[String]| groups.iter().any(|g| list.contains(g));
    if member(&c.admin_groups) {
        return Some((Role::Admin, Scope::all()));
    }
    if member(&c.viewer_groups) {
        return Some((Role::Viewer, Scope::all()));
    }
    let teams: Vec<&String> = groups.iter().filter_map(|g| c.team_groups.get(g)).collect();
    Scope::teams(teams).ok().map(|s| (Role::Viewer, s))
}

fn http_client() -> Result<reqwest::Client, OidcError> {
    reqwest::Client::builder()
        // A redirect followed here could be sent anywhere (server-side request forgery).
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| OidcError::Unavailable(e.to_string()))
}

/// What `cause` says, with what caused it: `error sending request: connection refused`.
fn chain(cause: &dyn std::error::Error) -> String {
    let mut text = cause.to_string();
    let mut source = cause.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The provider as its discovery document describes it now (keys rotate: read at each sign-in).
async fn client(c: &OidcConfig, http: &reqwest::Client) -> Result<ProviderClient, OidcError> {
    let issuer =
        IssuerUrl::new(c.issuer.clone()).map_err(|e| OidcError::Unavailable(e.to_string()))?;
    let metadata = CoreProviderMetadata::discover_async(issuer, http)
        .await
        .map_err(|e| OidcError::Unavailable(chain(&e)))?;
    let secret = c
        .client_secret
        .as_ref()
        .map(|s| s.0.clone())
        .or_else(|| std::env::var(SECRET_ENV).ok())
        .map(ClientSecret::new);
    let redirect = RedirectUrl::new(c.redirect_url.clone())
        .map_err(|e| OidcError::Unavailable(e.to_string()))?;
    Ok(
        ProviderClient::from_provider_metadata(
            metadata,
            ClientId::new(c.client_id.clone()),
            secret,
        )
        .set_redirect_uri(redirect),
    )
}

/// A sign-in sent to the provider: where to send the browser, and the state to keep in its
/// cookie (the callback must come back to the browser that started it).
#[derive(Debug)]
pub struct Started {
    pub authorize_url: String,
    pub state: String,
}

/// Starts a sign-in: a PKCE challenge, a state and a nonce, the verifier and nonce kept in the
/// database for whichever replica the callback reaches.
pub async fn begin(
    store: &dyn Store,
    config: Option<&OidcConfig>,
    next: &str,
    now_ms: i64,
) -> Result<Started, OidcError> {
    let c = config.ok_or(OidcError::NotConfigured)?;
    let http = http_client()?;
    let client = client(c, &http).await?;
    let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
    let mut request = client
        .authorize_url(
            AuthenticationFlow::<CoreResponseType>::AuthorizationCode,
            CsrfToken::new_random,
            Nonce::new_random,
        )
        .set_pkce_challenge(challenge);
    for scope in c.scopes.iter().filter(|s| s.as_str() != "openid") {
        request = request.add_scope(openidconnect::Scope::new(scope.clone()));
    }
    let (url, state, nonce) = request.url();
    let login = OidcLogin {
        verifier: verifier.secret().clone(),
        nonce: nonce.secret().clone(),
        next: next.to_owned(),
    };
    store::accounts::put_oidc_login(
        store.db(),
        &hash_token(state.secret()),
        &login,
        now_ms,
        now_ms - LOGIN_TTL_MS,
    )
    .await?;
    Ok(Started {
        authorize_url: url.to_string(),
        state: state.secret().clone(),
    })
}

/// What the provider sent the browser back with, and the state its cookie kept.
#[derive(Debug, Default)]
pub struct Callback {
    pub cookie_state: Option<String>,
    pub state: Option<String>,
    pub code: Option<String>,
    pub error: Option<String>,
    pub error_description: Option<String>,
}

/// A person signed in through the provider: their new session's secret and where they go.
#[derive(Debug)]
pub struct SsoSignIn {
    pub session: String,
    pub next: String,
    pub username: String,
}

/// Finishes a sign-in: the state matches this browser's and a sign-in under way (used once),
/// the code is exchanged with the PKCE verifier, the ID token verified, the groups mapped.
/// Only then is the person added or updated and a session started.
pub async fn finish(
    store: &dyn Store,
    config: Option<&OidcConfig>,
    back: Callback,
    now_ms: i64,
) -> Result<SsoSignIn, OidcError> {
    let c = config.ok_or(OidcError::NotConfigured)?;
    let state = back.state.unwrap_or_default();
    let same_browser = back
        .cookie_state
        .is_some_and(|kept| !state.is_empty() && crate::session::tokens_equal(&kept, &state));
    if !same_browser {
        return Err(OidcError::Expired);
    }
    let login =
        store::accounts::take_oidc_login(store.db(), &hash_token(&state), now_ms - LOGIN_TTL_MS)
            .await?
            .ok_or(OidcError::Expired)?;
    if let Some(error) = back.error {
        let described = back
            .error_description
            .map_or(error.clone(), |d| format!("{error}: {d}"));
        return Err(OidcError::Denied(described.chars().take(300).collect()));
    }
    let code = back
        .code
        .filter(|c| !c.is_empty())
        .ok_or_else(|| OidcError::Refused("the callback carries no code".into()))?;
    let http = http_client()?;
    let client = client(c, &http).await?;
    let token = client
        .exchange_code(AuthorizationCode::new(code))
        .map_err(|e| OidcError::Unavailable(e.to_string()))?
        .set_pkce_verifier(PkceCodeVerifier::new(login.verifier))
        .request_async(&http)
        .await
        .map_err(|e| match e {
            openidconnect::RequestTokenError::Request(_) => OidcError::Unavailable(chain(&e)),
            e => OidcError::Refused(chain(&e)),
        })?;
    let id_token = token
        .id_token()
        .ok_or_else(|| OidcError::Refused("the token response has no ID token".into()))?;
    let claims = id_token
        .claims(&client.id_token_verifier(), &Nonce::new(login.nonce))
        .map_err(|e| OidcError::Refused(format!("the ID token does not verify: {}", chain(&e))))?;
    let groups = match claims.additional_claims().strings(&c.groups_claim) {
        Some(groups) => groups,
        // Not in the ID token: some providers give it only at the user-info endpoint.
        None => {
            match client.user_info(token.access_token().clone(), Some(claims.subject().clone())) {
                Ok(request) => request
                    .request_async::<ProviderClaims, _, CoreGenderClaim>(&http)
                    .await
                    .map_err(|e| OidcError::Refused(format!("user info: {}", chain(&e))))?
                    .additional_claims()
                    .strings(&c.groups_claim)
                    .unwrap_or_default(),
                Err(_) => Vec::new(),
            }
        }
    };
    let username = claims
        .preferred_username()
        .map(|u| u.as_str().to_owned())
        .or_else(|| claims.email().map(|e| e.as_str().to_owned()))
        .unwrap_or_else(|| claims.subject().as_str().to_owned());
    let subject = format!("{}#{}", c.issuer, claims.subject().as_str());
    let Some((role, scope)) = access_of(c, &groups) else {
        tracing::warn!(
            username,
            ?groups,
            "single sign-on: in no group that gives access"
        );
        crate::session::end_provider_sessions(store, &subject).await?;
        return Err(OidcError::NoAccess(format!(
            "{username} is in none of the provider's groups that give access to gpuledger: \
             ask an admin."
        )));
    };
    let session =
        crate::session::sign_in_from_provider(store, &subject, &username, (role, &scope), now_ms)
            .await?;
    Ok(SsoSignIn {
        session,
        next: login.next,
        username,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> OidcConfig {
        OidcConfig {
            issuer: "https://idp.example.com".into(),
            client_id: "gpuledger".into(),
            client_secret: None,
            redirect_url: "https://gpuledger.example.com/login/oidc/callback".into(),
            name: "Example SSO".into(),
            scopes: vec!["groups".into()],
            groups_claim: "groups".into(),
            admin_groups: vec!["gpl-admins".into()],
            viewer_groups: vec!["finance".into()],
            team_groups: [
                ("team-serving".to_owned(), "serving".to_owned()),
                ("team-research".to_owned(), "research".to_owned()),
            ]
            .into(),
        }
    }

    fn groups(g: &[&str]) -> Vec<String> {
        g.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn groups_give_a_role_and_teams() {
        let c = config();
        assert_eq!(
            access_of(&c, &groups(&["team-serving", "gpl-admins"])),
            Some((Role::Admin, Scope::all()))
        );
        assert_eq!(
            access_of(&c, &groups(&["finance", "team-serving"])),
            Some((Role::Viewer, Scope::all()))
        );
        assert_eq!(
            access_of(&c, &groups(&["team-serving", "team-research", "x"])),
            Some((Role::Viewer, Scope::teams(["research", "serving"]).unwrap()))
        );
        assert_eq!(access_of(&c, &groups(&["everyone"])), None);
        assert_eq!(access_of(&c, &[]), None);
    }

    #[test]
    fn a_config_that_could_not_work_is_refused() {
        use crate::config::check_oidc as check_config;
        assert_eq!(check_config(&config()), Ok(()));
        let mut c = config();
        c.redirect_url = "https://gpuledger.example.com/elsewhere".into();
        assert!(check_config(&c)
            .unwrap_err()
            .contains("/login/oidc/callback"));
        let mut c = config();
        c.issuer = "http://idp.example.com".into();
        assert!(check_config(&c).unwrap_err().contains("not https"));
        c.issuer = "http://127.0.0.1:9000".into();
        assert_eq!(check_config(&c), Ok(()), "a provider on this machine");
        let mut c = config();
        c.issuer = "not a url".into();
        assert!(check_config(&c).unwrap_err().contains("issuer"));
        let mut c = config();
        (c.admin_groups, c.viewer_groups, c.team_groups) = Default::default();
        assert!(check_config(&c)
            .unwrap_err()
            .contains("nobody could sign in"));
    }

    #[test]
    fn a_groups_claim_is_a_list_or_one_name() {
        let claims: ProviderClaims =
            serde_json::from_str(r#"{"groups":["a","b",3],"role":"admin","n":5}"#).unwrap();
        assert_eq!(claims.strings("groups"), Some(groups(&["a", "b"])));
        assert_eq!(claims.strings("role"), Some(groups(&["admin"])));
        assert_eq!(claims.strings("n"), Some(Vec::new()));
        assert_eq!(claims.strings("missing"), None);
    }
}
