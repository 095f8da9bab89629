//! An HTTP admin API over [`LivePolicies`], as an axum [`Router`] the
//! application nests under a path and its own authentication.

use std::sync::Arc;
use std::time::SystemTime;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use sha2::{Digest, Sha256};

use super::{LiveError, LivePolicies};
use crate::error::ConfigError;
use crate::key::Key;
use crate::policy::spec::PolicySpec;

/// The largest request body the API reads (a policy text or a plan name);
/// a longer one is answered 413.
const MAX_BODY: usize = 4 * 1024;

/// Turns an identity as clients send it into the key the limits know.
type Identify = dyn Fn(&str) -> Option<Key> + Send + Sync;

/// The admin API of [`LivePolicies`] (cargo feature `admin`): an axum
/// [`Router`] that changes the fleet's limits while it runs. Nest it where you want it (`/admin`
/// below); its routes are relative to that path. Bodies are plain text in
/// the policy syntax of [`spec`](crate::policy::spec) (`1/s burst 5`,
/// `25/5s + 300/min sliding-log`), at most 4 KiB (413 beyond).
///
/// | route | does | answers |
/// |---|---|---|
/// | `GET /policies` | every policy and its limits now | 200, JSON `{"ping": "1/s burst 5", ...}` |
/// | `PUT /policies/{policy}` | replaces the policy's limits (body: the limits) | 200 and the policy's text; 400 with the parse error (nothing changed); 404 for an unknown policy |
/// | `DELETE /policies/{policy}` | gives the policy its default limits back | 200 and its text |
/// | `PUT /overrides/{policy}/{identity}` | the identity's own limits for the policy (body: the limits) | 200 and the limits' text; 400; 404 |
/// | `DELETE /overrides/{policy}/{identity}` | takes them away | 204 |
/// | `PUT /plans/{identity}` | assigns a plan (body: its name) | 200 and the name; 400 for an unknown plan |
/// | `DELETE /plans/{identity}` | takes the identity's plan away | 204 |
/// | `POST /reset/{policy}/{identity}` | clears the identity's state under the policy | 204; 404 for an unknown policy |
/// | `POST /reset/{identity}` | clears it under every policy | 204 |
/// | `GET /instances` | the instances sharing the store, from their heartbeats | 200, JSON `[{"id", "address", "started", "last_seen"}]` (RFC 3339 times) |
///
/// `{identity}` is the identity as clients send it (an `x-api-key` value,
/// an IP address), percent-encoded in the path; the function given to
/// [`new`](Self::new) turns it into the [`Key`] the layer's extractor
/// makes of it, or refuses it (`None`: 400). An `{identity}` holding a
/// control character (U+0000 to U+001F, U+007F to U+009F, sent as `%0A`
/// and the like) is refused with 400 before it is read. A failure of the
/// store answers 503 with its error; nothing is then changed. Every change
/// is logged at `info` with the identity's key, never the raw identity.
///
/// With [`token`](Self::token), each call needs `Authorization: Bearer
/// <token>` (401 otherwise, on every path, known or not); without it, the
/// API trusts whatever the application put in front of it.
///
/// ```
/// use axum::Router;
/// use fleetgate::key::{HeaderKey, KeyExtractor};
/// use fleetgate::live::{AdminApi, LivePolicies};
/// use fleetgate::spec::PolicySpec;
/// use fleetgate::MemoryStore;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let live = LivePolicies::new(MemoryStore::new());
/// let api = live.limiter("10/s burst 20".parse::<PolicySpec>()?.build("api")?);
/// // Identities keyed as the layer's extractor keys them: the same
/// // extractor, on a request carrying the raw value.
/// let by_api_key = HeaderKey::new("x-api-key");
/// let admin = AdminApi::new(live.clone(), move |raw: &str| {
///     let req = http::Request::get("/").header("x-api-key", raw).body(()).ok()?;
///     by_api_key.extract(&req)
/// })
/// .token(std::env::var("ADMIN_TOKEN").unwrap_or_default())
/// .router();
/// let app: Router = Router::new().nest("/admin", admin);
/// // Then `live.start().await?` and serve `app`; `api` goes in a
/// // `RateLimitLayer`.
/// # let _ = (api, app);
/// # Ok(()) }
/// ```
#[must_use = "an AdminApi does nothing until its router is served"]
pub struct AdminApi {
    live: LivePolicies,
    identity: Arc<Identify>,
    token: Option<[u8; 32]>,
}

impl AdminApi {
    /// The admin API of `live`, reading each `{identity}` of a path with
    /// `identity`.
    pub fn new(
        live: LivePolicies,
        identity: impl Fn(&str) -> Option<Key> + Send + Sync + 'static,
    ) -> Self {
        AdminApi {
            live,
            identity: Arc::new(identity),
            token: None,
        }
    }

    /// Requires `Authorization: Bearer <token>` on every call, compared in
    /// constant time (only digests of it are kept and compared). An empty
    /// token matches no call: a token read from an unset variable locks
    /// the API rather than opening it.
    pub fn token(mut self, token: impl AsRef<[u8]>) -> Self {
        self.token = Some(Sha256::digest(token.as_ref()).into());
        self
    }

    /// The API's routes, to nest in the application's router.
    pub fn router<S>(self) -> Router<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        let api = Arc::new(self);
        Router::new()
            .route("/policies", get(policies))
            .route("/policies/{policy}", put(set_policy).delete(restore_policy))
            .route(
                "/overrides/{policy}/{identity}",
                put(set_override).delete(remove_override),
            )
            .route("/plans/{identity}", put(assign_plan).delete(remove_plan))
            .route("/reset/{policy}/{identity}", post(reset_one))
            .route("/reset/{identity}", post(reset_all))
            .route("/instances", get(instances))
            .layer(DefaultBodyLimit::max(MAX_BODY))
            .layer(middleware::from_fn_with_state(api.clone(), authorize))
            .with_state(api)
    }
}

impl AdminApi {
    /// The key of `identity`, a path's `{identity}`; or why it is refused.
    fn key(&self, identity: &str) -> Result<Key, BadRequest> {
        if has_control(identity) {
            return Err(BadRequest::control("identity"));
        }
        (self.identity)(identity)
            .ok_or_else(|| BadRequest("not an identity the rate limits know".into()))
    }
}

impl std::fmt::Debug for AdminApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminApi")
            .field("live", &self.live)
            .field("token", &self.token.is_some())
            .finish_non_exhaustive()
    }
}

type Api = State<Arc<AdminApi>>;

async fn authorize(State(api): Api, req: Request, next: Next) -> Response {
    if let Some(expected) = &api.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .map(|value| value.as_bytes())
            .filter(|value| value.len() > 7 && value[..7].eq_ignore_ascii_case(b"bearer "))
            .map(|value| <[u8; 32]>::from(Sha256::digest(&value[7..])));
        let same = given.is_some_and(|given| {
            // Every byte is compared, whatever differs first.
            given
                .iter()
                .zip(expected)
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
        });
        if !same {
            let mut refused = text(StatusCode::UNAUTHORIZED, "a bearer token is required");
            refused
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return refused;
        }
    }
    next.run(req).await
}

async fn policies(State(api): Api) -> Response {
    let policies = api.live.policies().into_iter();
    json(&serde_json::Value::Object(
        policies
            .map(|(name, limits)| (name, serde_json::Value::String(limits)))
            .collect(),
    ))
}

async fn set_policy(State(api): Api, Path(policy): Path<String>, body: String) -> Response {
    match api.live.set_policy(&policy, body.trim()).await {
        Ok(now) => {
            let now = PolicySpec::from(&now).to_string();
            tracing::info!(policy, limits = now, "admin: policy changed");
            text(StatusCode::OK, &now)
        }
        Err(err) => refused(err),
    }
}

async fn restore_policy(State(api): Api, Path(policy): Path<String>) -> Response {
    match api.live.restore_policy(&policy).await {
        Ok(now) => {
            let now = PolicySpec::from(&now).to_string();
            tracing::info!(policy, limits = now, "admin: policy restored");
            text(StatusCode::OK, &now)
        }
        Err(err) => refused(err),
    }
}

async fn set_override(
    State(api): Api,
    Path((policy, identity)): Path<(String, String)>,
    body: String,
) -> Response {
    let key = match api.key(&identity) {
        Ok(key) => key,
        Err(refused) => return refused.into_response(),
    };
    let limits = body.trim();
    match api.live.set_override(&policy, &key, Some(limits)).await {
        Ok(()) => {
            // Validated by `set_override`: the text it stored.
            let limits = limits
                .parse::<PolicySpec>()
                .map_or_else(|_| limits.to_owned(), |spec| spec.to_string());
            tracing::info!(policy, key = %key.text(), limits, "admin: override set");
            text(StatusCode::OK, &limits)
        }
        Err(err) => refused(err),
    }
}

async fn remove_override(
    State(api): Api,
    Path((policy, identity)): Path<(String, String)>,
) -> Response {
    let key = match api.key(&identity) {
        Ok(key) => key,
        Err(refused) => return refused.into_response(),
    };
    match api.live.set_override(&policy, &key, None).await {
        Ok(()) => {
            tracing::info!(policy, key = %key.text(), "admin: override removed");
            StatusCode::NO_CONTENT.into_response()
        }
        Err(err) => refused(err),
    }
}

async fn assign_plan(State(api): Api, Path(identity): Path<String>, body: String) -> Response {
    let key = match api.key(&identity) {
        Ok(key) => key,
        Err(refused) => return refused.into_response(),
    };
    let plan = body.trim();
    match api.live.assign_plan(&key, Some(plan)).await {
        Ok(()) => {
            tracing::info!(plan, key = %key.text(), "admin: plan assigned");
            text(StatusCode::OK, plan)
        }
        Err(err) => refused(err),
    }
}

async fn remove_plan(State(api): Api, Path(identity): Path<String>) -> Response {
    let key = match api.key(&identity) {
        Ok(key) => key,
        Err(refused) => return refused.into_response(),
    };
    match api.live.assign_plan(&key, None).await {
        Ok(()) => {
            tracing::info!(key = %key.text(), "admin: plan removed");
            StatusCode::NO_CONTENT.into_response()
        }
        Err(err) => refused(err),
    }
}

async fn reset_one(State(api): Api, Path((policy, identity)): Path<(String, String)>) -> Response {
    reset(&api, &identity, Some(&policy)).await
}

async fn reset_all(State(api): Api, Path(identity): Path<String>) -> Response {
    reset(&api, &identity, None).await
}

async fn reset(api: &AdminApi, identity: &str, policy: Option<&str>) -> Response {
    let key = match api.key(identity) {
        Ok(key) => key,
        Err(refused) => return refused.into_response(),
    };
    match api.live.reset(&key, policy).await {
        Ok(()) => {
            tracing::info!(policy = policy.unwrap_or("*"), key = %key.text(), "admin: reset");
            StatusCode::NO_CONTENT.into_response()
        }
        Err(err) => refused(err),
    }
}

async fn instances(State(api): Api) -> Response {
    let instances = api
        .live
        .instances()
        .iter()
        .map(|instance| {
            serde_json::json!({
                "id": instance.id,
                "address": instance.address,
                "started": rfc3339(instance.started),
                "last_seen": rfc3339(instance.last_seen),
            })
        })
        .collect();
    json(&serde_json::Value::Array(instances))
}

/// The status a refused change answers with: what the path names is
/// missing (404), the body is wrong (400), or the store failed (503).
fn refused(err: LiveError) -> Response {
    let status = match &err {
        LiveError::Config(ConfigError::UnknownPolicy { .. }) => StatusCode::NOT_FOUND,
        LiveError::Parse(_) | LiveError::Config(_) => StatusCode::BAD_REQUEST,
        LiveError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    text(status, &err.to_string())
}

/// Whether a path's `{identity}` holds a control character (C0, DEL or
/// C1): never one a client sends, and one a log or a terminal would act
/// on.
fn has_control(text: &str) -> bool {
    text.chars().any(char::is_control)
}

/// A path's `{identity}` or `{cidr}` refused before anything else is
/// read: 400 with this message.
struct BadRequest(String);

impl BadRequest {
    fn control(what: &str) -> Self {
        BadRequest(format!("the {what} holds a control character"))
    }
}

impl IntoResponse for BadRequest {
    fn into_response(self) -> Response {
        text(StatusCode::BAD_REQUEST, &self.0)
    }
}

fn text(status: StatusCode, body: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{body}\n"),
    )
        .into_response()
}

/// `value` as pretty JSON.
fn json(value: &serde_json::Value) -> Response {
    match serde_json::to_string_pretty(value) {
        Ok(mut body) => {
            body.push('\n');
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(err) => text(StatusCode::INTERNAL_SERVER_ERROR, &err.to_string()),
    }
}

/// `t` as RFC 3339 in UTC, to the millisecond (`2026-11-26T23:01:02.345Z`).
fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;
    use axum::body::Body;
    use std::time::{Duration, UNIX_EPOCH};
    use tower::ServiceExt;

    async fn call(app: &Router, method: &str, path: &str, body: &str) -> (u16, String) {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header(header::AUTHORIZATION, "Bearer s3cret")
            .body(Body::from(body.to_owned()))
            .unwrap();
        let res = app.clone().oneshot(req).await.unwrap();
        let status = res.status().as_u16();
        let bytes = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn changes_answer_what_they_did() {
        let live = LivePolicies::new(MemoryStore::new());
        let limiter = live.limiter("1/min".parse::<PolicySpec>().unwrap().build("api").unwrap());
        live.define_plan(
            "pro",
            "5/min".parse::<PolicySpec>().unwrap().build("api").unwrap(),
        )
        .unwrap();
        let app: Router = AdminApi::new(live.clone(), |raw| Some(Key::new(format!("k:{raw}"))))
            .token("s3cret")
            .router();

        let no_token = http::Request::get("/policies").body(Body::empty()).unwrap();
        assert_eq!(app.clone().oneshot(no_token).await.unwrap().status(), 401);
        let wrong = http::Request::get("/nowhere")
            .header(header::AUTHORIZATION, "Bearer s3cre")
            .body(Body::empty())
            .unwrap();
        assert_eq!(app.clone().oneshot(wrong).await.unwrap().status(), 401);
        let lower = http::Request::get("/policies")
            .header(header::AUTHORIZATION, "bearer s3cret")
            .body(Body::empty())
            .unwrap();
        assert_eq!(app.clone().oneshot(lower).await.unwrap().status(), 200);
        let locked: Router = AdminApi::new(live.clone(), |_| None).token("").router();
        let empty = http::Request::get("/policies")
            .header(header::AUTHORIZATION, "Bearer ")
            .body(Body::empty())
            .unwrap();
        assert_eq!(locked.oneshot(empty).await.unwrap().status(), 401);

        assert_eq!(
            call(&app, "GET", "/policies", "").await,
            (200, "{\n  \"api\": \"1/min\"\n}\n".into())
        );
        assert_eq!(
            call(&app, "PUT", "/policies/api", "2/min\n").await,
            (200, "2/min\n".into())
        );
        let (status, body) = call(&app, "PUT", "/policies/api", "2/lightyear").await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(call(&app, "PUT", "/policies/nope", "2/min").await.0, 404);
        assert_eq!(live.policies()["api"], "2/min");
        assert_eq!(
            call(&app, "PUT", "/policies/api", &"1".repeat(5000))
                .await
                .0,
            413
        );

        let a = Key::new("k:a");
        assert_eq!(
            call(&app, "PUT", "/overrides/api/a", "3/min").await,
            (200, "3/min\n".into())
        );
        for _ in 0..3 {
            assert!(limiter.check(&a, 1).await.unwrap().is_allowed());
        }
        assert!(!limiter.check(&a, 1).await.unwrap().is_allowed());
        assert_eq!(call(&app, "POST", "/reset/api/a", "").await.0, 204);
        assert!(limiter.check(&a, 1).await.unwrap().is_allowed());
        assert_eq!(call(&app, "DELETE", "/overrides/api/a", "").await.0, 204);
        assert_eq!(call(&app, "POST", "/reset/nope/a", "").await.0, 404);
        assert_eq!(call(&app, "POST", "/reset/a", "").await.0, 204);

        assert_eq!(call(&app, "PUT", "/plans/b", "gold").await.0, 400);
        assert_eq!(
            call(&app, "PUT", "/plans/b", "pro").await,
            (200, "pro\n".into())
        );
        let b = Key::new("k:b");
        for _ in 0..5 {
            assert!(limiter.check(&b, 1).await.unwrap().is_allowed());
        }
        assert!(!limiter.check(&b, 1).await.unwrap().is_allowed());
        assert_eq!(call(&app, "DELETE", "/plans/b", "").await.0, 204);

        let (status, body) = call(&app, "GET", "/instances", "").await;
        assert_eq!(status, 200);
        assert!(body.contains("\"started\": \"20"), "{body}");
    }

    #[tokio::test]
    async fn identities_with_control_characters_are_refused() {
        let live = LivePolicies::new(MemoryStore::new());
        let _api = live.limiter("1/min".parse::<PolicySpec>().unwrap().build("api").unwrap());
        live.define_plan(
            "pro",
            "5/min".parse::<PolicySpec>().unwrap().build("api").unwrap(),
        )
        .unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let asked = seen.clone();
        let app: Router = AdminApi::new(live.clone(), move |raw: &str| {
            asked.lock().unwrap().push(raw.to_owned());
            Some(Key::new(format!("k:{raw}")))
        })
        .token("s3cret")
        .router();
        for (method, path, body) in [
            ("PUT", "/overrides/api/a%0A", "5/min"),
            ("DELETE", "/overrides/api/a%0A", ""),
            ("PUT", "/plans/a%0D%0A", "pro"),
            ("PUT", "/plans/a%09b", "pro"),
            ("PUT", "/plans/a%7F", "pro"),
            ("PUT", "/plans/a%C2%85", "pro"),
            ("DELETE", "/plans/%00", ""),
            ("POST", "/reset/api/a%0A", ""),
            ("POST", "/reset/a%1B%5B2J", ""),
        ] {
            let (status, answer) = call(&app, method, path, body).await;
            assert_eq!(status, 400, "{method} {path}: {answer}");
            assert!(
                answer.contains("control character"),
                "{method} {path}: {answer}"
            );
        }
        // Refused before the identity function is asked: nothing changed.
        assert_eq!(*seen.lock().unwrap(), Vec::<String>::new());
        // A space and a letter beyond ASCII are no control characters.
        assert_eq!(
            call(&app, "PUT", "/plans/a%20%C3%A9", "pro").await,
            (200, "pro\n".into())
        );
        assert_eq!(*seen.lock().unwrap(), ["a é"]);
    }

    #[test]
    fn times_are_rfc3339() {
        let at = |ms| rfc3339(UNIX_EPOCH + Duration::from_millis(ms));
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400_007), "2000-02-29T00:00:00.007Z");
        assert_eq!(at(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(at(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }
}
