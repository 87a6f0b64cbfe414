//! The API's OpenAPI 3.1 description, generated from the handlers' own types and attributes,
//! served at `/api/v1/openapi.json`. `docs/openapi.json` is the committed copy a test keeps
//! equal to it; another test calls every operation on a running server and validates each
//! answer against it (`openapi_tests.rs`).

use std::sync::LazyLock;

use axum::Json;
use gpuledger_proto::ApiErrorBody;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::OpenApi;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;

/// Where the document is served (as the route below and its description say).
pub const OPENAPI_PATH: &str = "/api/v1/openapi.json";

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(openapi_json))
}

#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    tag = "meta",
    summary = "This description",
    responses((status = 200, description = "The OpenAPI 3.1 document.", content_type = "application/json", body = Object)),
)]
async fn openapi_json() -> Json<&'static utoipa::openapi::OpenApi> {
    Json(document())
}

/// The document: what [`ApiDoc`] says of the API as a whole, with every operation the router
/// serves ([`super::routes`]), made once.
pub fn document() -> &'static utoipa::openapi::OpenApi {
    static DOCUMENT: LazyLock<utoipa::openapi::OpenApi> =
        LazyLock::new(|| super::routes(0, 0).into_openapi());
    &DOCUMENT
}

/// What the document says of the API as a whole; its operations come from the routes.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "gpuledger",
        description = "GPU cost observability: every dollar of the GPU bill attributed to its \
            owners or to an explicit idle bucket, exactly to the bill. Money is a decimal \
            string (never a float) in the currency named beside it; times are RFC 3339 unless \
            a field ends in `_ms` (epoch milliseconds). Errors are `{\"error\", \"message\", \
            \"field\"}` with the status that says what went wrong. See docs/api.md.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    // Schemas only parameters name (the generator collects those of bodies itself).
    components(schemas(ApiErrorBody, super::params::TableFormat, super::allocation::AllocationFormat)),
    modifiers(&SecuritySchemes),
    tags(
        (name = "allocation", description = "Who the bill belongs to, and why it changed."),
        (name = "billing", description = "The bills imported, and the month against the ledger."),
        (name = "budgets", description = "Budgets per owner, with the month's forecast."),
        (name = "anomalies", description = "Owners whose daily spend left its pattern."),
        (name = "waste", description = "Idle GPUs: incidents, idle history, recommendations."),
        (name = "unit costs", description = "Cost per request and per training run."),
        (name = "agents", description = "What agents and serving code send in."),
        (name = "operations", description = "Health and metrics."),
        (name = "slack", description = "Slack app mode: what Slack sends, signed."),
        (name = "meta", description = "This description."),
    ),
)]
pub struct ApiDoc;

/// Who may call what: the security schemes operations name.
struct SecuritySchemes;

impl utoipa::Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let bearer = |description: &str| {
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(description))
                    .build(),
            )
        };
        components.add_security_scheme(
            "read_token",
            bearer(
                "A read-only token (`gpr_…`) an admin creates on /tokens, for BI tools and \
                 Prometheus: GET only, narrowed to the token's teams where it has some.",
            ),
        );
        components.add_security_scheme(
            "session",
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
                super::cookies::SESSION_COOKIE,
                "A signed-in browser session. Writes also need an admin, and are refused when \
                 the browser says another site's page sent them (Sec-Fetch-Site, Origin); \
                 scripts send neither.",
            ))),
        );
        components.add_security_scheme(
            "agent_token",
            bearer(
                "An agent token (`gpl_…`) from `gpuledger-server token create`: for agents' \
                 reports and serving code's request counts.",
            ),
        );
        components.add_security_scheme(
            "slack_signature",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-Slack-Signature",
                "Slack's signature of the request (`v0=` HMAC-SHA256 of `v0:<timestamp>:<body>` \
                 with the app's signing secret), with its time in X-Slack-Request-Timestamp, \
                 at most five minutes off.",
            ))),
        );
    }
}
