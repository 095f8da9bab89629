//! An HTTP admin API over [`LivePolicies`], as an axum [`Router`] the
//! application nests under a path and its own authentication.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post, put};
use sha2::{Digest, Sha256};

use super::{List, Listed, LiveError, LivePolicies};
use crate::error::ConfigError;
use crate::key::{IpNet, Key};
use crate::policy::spec::{PolicySpec, parse_duration};

/// The largest request body the API reads (a policy text, a plan name, a
/// duration); a longer one is answered 413.
const MAX_BODY: usize = 4 * 1024;

/// Turns an identity as clients send it into the key the limits know.
type Identify = dyn Fn(&str) -> Option<Key> + Send + Sync;

/// The admin API of [`LivePolicies`] (cargo feature `admin`): an axum
/// [`Router`] that changes the fleet's limits while it runs. Nest it where you want it (`/admin`
/// below); its routes are relative to that path. Bodies are plain text in
/// the policy syntax of [`spec`](crate::policy::spec) (`1/s burst 5`,
/// `25/5s + 300/min sliding-log`) or a duration (`10m`, `1h30min`), at
/// most 4 KiB (413 beyond).
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
/// | `PUT /deny/{identity}` | refuses the identity on every policy ([`deny`](LivePolicies::deny); body: empty for no end, or a duration such as `10m`) | 204; 400 for a bad or out-of-range duration (zero, over 10 years) or past 100,000 entries |
/// | `PUT /deny/{policy}/{identity}` | refuses it on one policy | 204; 400; 404 for an unknown policy |
/// | `DELETE /deny/{identity}`, `DELETE /deny/{policy}/{identity}` | takes that entry off ([`unlist`](LivePolicies::unlist); none is no error) | 204; 404 |
/// | `PUT`/`DELETE /allow/{identity}`, `/allow/{policy}/{identity}` | the same for the allow list: the identity passes without a decision ([`allow`](LivePolicies::allow)) | as `/deny` |
/// | `PUT`/`DELETE /deny-net/{cidr}`, `/deny-net/{policy}/{cidr}` | the same for a network (`203.0.113.0%2F24`, `2001:db8::%2F32`, or a bare address), matching every IP key in it | as `/deny`; 400 for a bad network (`10.0.0.0%2F33`), or for its `/` not percent-encoded |
/// | `PUT`/`DELETE /allow-net/{cidr}`, `/allow-net/{policy}/{cidr}` | a network on the allow list | as `/deny-net` |
/// | `GET /lists` | the deny and allow entries in force (as of the last poll) | 200, JSON `[{"list": "deny"\|"allow", "policy": null\|"api", "identity": "<key>" or "network": "203.0.113.0/24", "expires": null\|"<RFC 3339>"}]` |
///
/// `{identity}` is the identity as clients send it (an `x-api-key` value,
/// an IP address), percent-encoded in the path; the function given to
/// [`new`](Self::new) turns it into the [`Key`] the layer's extractor
/// makes of it, or refuses it (`None`: 400). An `{identity}` or `{cidr}`
/// holding a control character (U+0000 to U+001F, U+007F to U+009F, sent
/// as `%0A` and the like) is refused with 400 before it is read. In
/// `/lists`, `"identity"` is that key (`ip:203.0.113.7`, or the `h:` digest
/// of an API key), not the raw identity. A failure of the store answers
/// 503 with its error; a request answered 400, 404 or 413 changes
/// nothing, and one answered 503 nothing in this instance (a write that
/// timed out may still reach Redis later: read the state back, as
/// [`LiveError::Store`] says). Every change is logged at `info` with the identity's key (or
/// the network), never the raw identity.
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
            .route("/deny/{identity}", every_policy(List::Deny, Kind::Key))
            .route(
                "/deny/{policy}/{identity}",
                one_policy(List::Deny, Kind::Key),
            )
            .route("/allow/{identity}", every_policy(List::Allow, Kind::Key))
            .route(
                "/allow/{policy}/{identity}",
                one_policy(List::Allow, Kind::Key),
            )
            .route("/deny-net/{cidr}", every_policy(List::Deny, Kind::Net))
            .route(
                "/deny-net/{policy}/{cidr}",
                one_policy(List::Deny, Kind::Net),
            )
            .route("/allow-net/{cidr}", every_policy(List::Allow, Kind::Net))
            .route(
                "/allow-net/{policy}/{cidr}",
                one_policy(List::Allow, Kind::Net),
            )
            .route("/lists", get(lists))
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

    /// What a list route's path names: the key of an `{identity}`, or the
    /// network of a `{cidr}`; or why it is refused.
    fn listed(&self, kind: Kind, target: &str) -> Result<Listed, BadRequest> {
        match kind {
            Kind::Key => self.key(target).map(Listed::Key),
            Kind::Net if has_control(target) => Err(BadRequest::control("network")),
            Kind::Net => target
                .parse::<IpNet>()
                .map(Listed::Net)
                .map_err(|err| BadRequest(err.to_string())),
        }
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

/// What the list routes' last path segment names.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// An `{identity}`, read by the API's identity function.
    Key,
    /// A `{cidr}`, a network.
    Net,
}

/// `PUT` and `DELETE` of a list route naming no policy: the entry for
/// every policy.
fn every_policy(list: List, kind: Kind) -> MethodRouter<Arc<AdminApi>> {
    put(
        move |State(api): Api, Path(target): Path<String>, body: String| async move {
            add(&api, list, None, kind, &target, &body).await
        },
    )
    .delete(
        move |State(api): Api, Path(target): Path<String>| async move {
            remove(&api, list, None, kind, &target).await
        },
    )
}

/// A list route's `{policy}` and `{identity}` or `{cidr}`.
type Scoped = Path<(String, String)>;

/// `PUT` and `DELETE` of a list route naming a policy.
fn one_policy(list: List, kind: Kind) -> MethodRouter<Arc<AdminApi>> {
    put(
        move |State(api): Api, Path((policy, target)): Scoped, body: String| async move {
            if let Some(refused) = slash_not_encoded(kind, &policy) {
                return refused;
            }
            add(&api, list, Some(&policy), kind, &target, &body).await
        },
    )
    .delete(
        move |State(api): Api, Path((policy, target)): Scoped| async move {
            if let Some(refused) = slash_not_encoded(kind, &policy) {
                return refused;
            }
            remove(&api, list, Some(&policy), kind, &target).await
        },
    )
}

/// A network route whose "policy" is an address: the network was sent
/// with its `/` as is (`/deny-net/203.0.113.0/24`), which splits it in
/// two. Refused (400) rather than read as a policy, whatever the rest.
fn slash_not_encoded(kind: Kind, policy: &str) -> Option<Response> {
    (matches!(kind, Kind::Net) && policy.parse::<IpAddr>().is_ok()).then(|| {
        text(
            StatusCode::BAD_REQUEST,
            "a network's / must be percent-encoded in the path: 203.0.113.0%2F24",
        )
    })
}

/// Puts what `target` names on `list` for `policy` (every policy:
/// `None`), until the duration in `body` has passed (empty: no end).
async fn add(
    api: &AdminApi,
    list: List,
    policy: Option<&str>,
    kind: Kind,
    target: &str,
    body: &str,
) -> Response {
    let listed = match api.listed(kind, target) {
        Ok(listed) => listed,
        Err(refused) => return refused.into_response(),
    };
    let expires_in = match body.trim() {
        "" => None,
        duration => match parse_duration(duration) {
            Ok(duration) => Some(duration),
            Err(err) => return refused(err.into()),
        },
    };
    let done = match list {
        List::Deny => api.live.deny(policy, listed.clone(), expires_in).await,
        List::Allow => api.live.allow(policy, listed.clone(), expires_in).await,
    };
    match done {
        Ok(()) => {
            let ends = ends_in(expires_in);
            let (list, policy) = (list.as_str(), policy.unwrap_or("*"));
            match &listed {
                Listed::Key(key) => {
                    tracing::info!(list, policy, key = %key.text(), ends, "admin: listed");
                }
                Listed::Net(net) => {
                    let network = net.to_string();
                    tracing::info!(list, policy, network, ends, "admin: listed");
                }
            }
            StatusCode::NO_CONTENT.into_response()
        }
        Err(err) => refused(err),
    }
}

/// Takes what `target` names off `list` for `policy`.
async fn remove(
    api: &AdminApi,
    list: List,
    policy: Option<&str>,
    kind: Kind,
    target: &str,
) -> Response {
    let listed = match api.listed(kind, target) {
        Ok(listed) => listed,
        Err(refused) => return refused.into_response(),
    };
    match api.live.unlist(list, policy, listed.clone()).await {
        Ok(()) => {
            let (list, policy) = (list.as_str(), policy.unwrap_or("*"));
            match &listed {
                Listed::Key(key) => {
                    tracing::info!(list, policy, key = %key.text(), "admin: unlisted");
                }
                Listed::Net(net) => {
                    let network = net.to_string();
                    tracing::info!(list, policy, network, "admin: unlisted");
                }
            }
            StatusCode::NO_CONTENT.into_response()
        }
        Err(err) => refused(err),
    }
}

/// When an entry added for `expires_in` ends, for the log.
fn ends_in(expires_in: Option<Duration>) -> String {
    expires_in.map_or_else(
        || "never".to_owned(),
        |d| format!("in {}", humantime::format_duration(d)),
    )
}

async fn lists(State(api): Api) -> Response {
    let entries = api
        .live
        .lists()
        .into_iter()
        .map(|entry| {
            let mut object = serde_json::Map::new();
            object.insert("list".into(), entry.list.as_str().into());
            object.insert("policy".into(), entry.policy.into());
            match &entry.listed {
                Listed::Key(key) => object.insert("identity".into(), key.text().to_string().into()),
                Listed::Net(net) => object.insert("network".into(), net.to_string().into()),
            };
            object.insert("expires".into(), entry.expires.and_then(rfc3339).into());
            serde_json::Value::Object(object)
        })
        .collect();
    json(&serde_json::Value::Array(entries))
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

/// Whether a path's `{identity}` or `{cidr}` holds a control character
/// (C0, DEL or C1): never one a client sends, and one a log or a terminal
/// would act on.
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

/// `t` as RFC 3339 in UTC, to the millisecond (`2026-11-26T23:01:02.345Z`),
/// or `None` (JSON `null`) for a time it cannot write (past the year 9999:
/// a stored value nobody meant).
fn rfc3339(t: SystemTime) -> Option<String> {
    use std::fmt::Write;
    let mut text = String::new();
    write!(text, "{}", humantime::format_rfc3339_millis(t)).ok()?;
    Some(text)
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

    /// The list routes' identity function: IPs as IP keys, `nobody`
    /// refused, anything else `k:` and itself.
    fn list_identity(raw: &str) -> Option<Key> {
        if raw == "nobody" {
            return None;
        }
        Some(
            raw.parse::<IpAddr>()
                .map_or_else(|_| Key::new(format!("k:{raw}")), Key::from_ip),
        )
    }

    fn list_app() -> (LivePolicies, Router) {
        let live = LivePolicies::new(MemoryStore::new());
        let _api = live.limiter("1/min".parse::<PolicySpec>().unwrap().build("api").unwrap());
        let app = AdminApi::new(live.clone(), list_identity)
            .token("s3cret")
            .router();
        (live, app)
    }

    /// `live.lists()` as (list, policy, what, ends in how many seconds).
    fn entries(live: &LivePolicies) -> Vec<(&'static str, Option<String>, String, Option<u64>)> {
        let mut entries: Vec<_> = live
            .lists()
            .into_iter()
            .map(|entry| {
                let left = entry.expires.map(|at| {
                    let left = at.duration_since(SystemTime::now()).unwrap_or_default();
                    // Rounded to the second: a test takes far less.
                    (left + Duration::from_millis(500)).as_secs()
                });
                (
                    entry.list.as_str(),
                    entry.policy,
                    entry.listed.to_string(),
                    left,
                )
            })
            .collect();
        entries.sort();
        entries
    }

    #[tokio::test]
    async fn list_routes_add_show_and_remove() {
        let (live, app) = list_app();
        let changes = [
            ("/deny/a", "10m", ("deny", None, "k:a", Some(600))),
            ("/deny/api/b%2Fc", "", ("deny", Some("api"), "k:b/c", None)),
            (
                "/allow/192.0.2.1",
                " 1h30min\n",
                ("allow", None, "ip:192.0.2.1", Some(5400)),
            ),
            ("/allow/api/p", "", ("allow", Some("api"), "k:p", None)),
            (
                "/deny-net/203.0.113.9%2F24",
                "90s",
                ("deny", None, "203.0.113.0/24", Some(90)),
            ),
            (
                "/deny-net/api/2001:db8::%2F32",
                "",
                ("deny", Some("api"), "2001:db8::/32", None),
            ),
            (
                "/allow-net/198.51.100.7",
                "",
                ("allow", None, "198.51.100.7/32", None),
            ),
            (
                "/allow-net/api/10.0.0.0%2F8",
                "1d",
                ("allow", Some("api"), "10.0.0.0/8", Some(86_400)),
            ),
        ];
        let mut expected = Vec::new();
        for (path, body, (list, policy, what, left)) in changes {
            let (status, answer) = call(&app, "PUT", path, body).await;
            assert_eq!((status, answer.as_str()), (204, ""), "PUT {path}");
            expected.push((list, policy.map(str::to_owned), what.to_owned(), left));
            expected.sort();
            assert_eq!(entries(&live), expected, "after PUT {path}");
        }
        // Listing again replaces the end.
        assert_eq!(call(&app, "PUT", "/deny/a", "").await.0, 204);
        let a = ("deny", None, "k:a".to_owned(), None);
        assert!(entries(&live).contains(&a), "{:?}", entries(&live));
        assert_eq!(entries(&live).len(), 8);

        let (status, body) = call(&app, "GET", "/lists", "").await;
        assert_eq!(status, 200, "{body}");
        let shown: serde_json::Value = serde_json::from_str(&body).unwrap();
        let shown = shown.as_array().unwrap();
        assert_eq!(shown.len(), 8, "{body}");
        let find = |field: &str, value: &str| {
            shown
                .iter()
                .find(|entry| entry[field] == value)
                .unwrap_or_else(|| panic!("no {field} {value} in {body}"))
        };
        let a = find("identity", "k:a");
        assert_eq!(
            (&a["list"], &a["policy"], &a["expires"]),
            (
                &"deny".into(),
                &serde_json::Value::Null,
                &serde_json::Value::Null
            )
        );
        let net = find("network", "203.0.113.0/24");
        assert_eq!(
            (&net["list"], &net["policy"]),
            (&"deny".into(), &serde_json::Value::Null)
        );
        assert!(net.get("identity").is_none(), "{body}");
        let expires = net["expires"].as_str().unwrap();
        let at = humantime::parse_rfc3339(expires).unwrap();
        let left = at.duration_since(SystemTime::now()).unwrap();
        assert!(
            left > Duration::from_secs(80) && left <= Duration::from_secs(90),
            "{expires}"
        );
        let p = find("identity", "k:p");
        assert_eq!((&p["list"], &p["policy"]), (&"allow".into(), &"api".into()));
        let v6 = find("network", "2001:db8::/32");
        assert_eq!(v6["policy"], "api");

        // DELETE takes the entry named off, and only that one; a second
        // time is no error.
        let removals = [
            ("/deny/a", "k:a"),
            ("/deny/api/b%2Fc", "k:b/c"),
            ("/allow/192.0.2.1", "ip:192.0.2.1"),
            ("/allow/api/p", "k:p"),
            ("/deny-net/203.0.113.0%2F24", "203.0.113.0/24"),
            ("/deny-net/api/2001:db8::%2F32", "2001:db8::/32"),
            ("/allow-net/198.51.100.7%2F32", "198.51.100.7/32"),
            ("/allow-net/api/10.0.0.0%2F8", "10.0.0.0/8"),
        ];
        for (i, (path, what)) in removals.into_iter().enumerate() {
            // The allow entry of `a` under every policy is not the deny
            // one: deleting it takes nothing off.
            if i == 0 {
                assert_eq!(call(&app, "DELETE", "/allow/a", "").await.0, 204);
                assert_eq!(entries(&live).len(), 8);
            }
            assert_eq!(
                call(&app, "DELETE", path, "").await,
                (204, String::new()),
                "{path}"
            );
            let left = entries(&live);
            assert_eq!(left.len(), 7 - i, "DELETE {path}: {left:?}");
            assert!(
                !left.iter().any(|entry| entry.2 == what),
                "DELETE {path}: {left:?}"
            );
            assert_eq!(call(&app, "DELETE", path, "").await.0, 204, "{path} again");
        }
        assert_eq!(call(&app, "GET", "/lists", "").await, (200, "[]\n".into()));
    }

    #[tokio::test]
    async fn list_routes_refuse_hostile_input_and_change_nothing() {
        let (live, app) = list_app();
        assert_eq!(
            call(&app, "PUT", "/deny-net/192.0.2.0%2F24", "").await.0,
            204
        );
        assert_eq!(call(&app, "PUT", "/allow/api/kept", "1h").await.0, 204);
        let before = entries(&live);
        assert_eq!(before.len(), 2);
        let refusals: &[(&str, &str, &str, u16)] = &[
            // Networks that are not.
            ("PUT", "/deny-net/10.0.0.0%2F33", "", 400),
            ("PUT", "/deny-net/2001:db8::%2F129", "", 400),
            ("PUT", "/allow-net/nonsense", "", 400),
            ("PUT", "/allow-net/api/300.0.0.1", "", 400),
            ("DELETE", "/deny-net/192.0.2.0%2F24x", "", 400),
            ("PUT", "/deny-net/192.0.2.0%2F", "", 400),
            // A network's slash sent as is.
            ("PUT", "/deny-net/203.0.113.0/24", "", 400),
            ("DELETE", "/deny-net/192.0.2.0/24", "", 400),
            // Control characters, percent-encoded.
            ("PUT", "/deny/a%0A", "", 400),
            ("PUT", "/deny/api/%00", "", 400),
            ("PUT", "/allow/a%7Fb", "", 400),
            ("PUT", "/allow/%C2%85", "", 400),
            ("PUT", "/deny-net/192.0.2.0%2F24%0D", "", 400),
            ("DELETE", "/deny-net/192.0.2.0%09%2F24", "", 400),
            ("DELETE", "/allow/api/kept%1B", "", 400),
            // An identity the identity function refuses.
            ("PUT", "/deny/nobody", "", 400),
            ("DELETE", "/allow/api/nobody", "", 400),
            // Durations: not one, zero, beyond 10 years, too long to hold.
            ("PUT", "/deny/a", "soon", 400),
            ("PUT", "/deny/a", "10", 400),
            ("PUT", "/deny/a", "10m and more", 400),
            ("PUT", "/deny/a", "0s", 400),
            ("PUT", "/allow-net/10.0.0.0%2F8", "0m", 400),
            ("PUT", "/deny/a", "3651d", 400),
            ("PUT", "/deny/a", "99999999999999999999999h", 400),
            ("PUT", "/deny/a", "-5m", 400),
            // Unknown policies.
            ("PUT", "/deny/nope/a", "", 404),
            ("DELETE", "/deny/nope/a", "", 404),
            ("PUT", "/allow-net/nope/10.0.0.0%2F8", "", 404),
            ("DELETE", "/allow/nope/kept", "", 404),
        ];
        for &(method, path, body, expected) in refusals {
            let (status, answer) = call(&app, method, path, body).await;
            assert_eq!(status, expected, "{method} {path} {body:?}: {answer}");
            assert_eq!(
                entries(&live),
                before,
                "{method} {path} {body:?} changed the lists"
            );
        }
        let (status, answer) = call(&app, "PUT", "/deny/a", &"1".repeat(5000)).await;
        assert_eq!(status, 413, "{answer}");
        let (status, answer) =
            call(&app, "PUT", "/deny/a", &format!("{}1m", " ".repeat(5000))).await;
        assert_eq!(status, 413, "{answer}");
        assert_eq!(entries(&live), before);

        // The message says what was wrong.
        let (_, answer) = call(&app, "PUT", "/deny/a%0A", "").await;
        assert!(answer.contains("control character"), "{answer}");
        let (_, answer) = call(&app, "PUT", "/deny-net/203.0.113.0/24", "").await;
        assert!(answer.contains("%2F"), "{answer}");
        let (_, answer) = call(&app, "PUT", "/deny/a", "0s").await;
        assert!(answer.contains("out of range"), "{answer}");
    }

    /// Past the bound on list entries (filled from inside, as the live
    /// module's own test does): 400, and nothing added.
    #[tokio::test]
    async fn a_full_list_answers_bad_request_and_changes_nothing() {
        let live = LivePolicies::new(MemoryStore::new());
        let _api = live.limiter("1/min".parse::<PolicySpec>().unwrap().build("api").unwrap());
        {
            let mut state = live.fleet.lock();
            for i in 0..super::super::MAX_LISTED {
                state
                    .changes
                    .deny
                    .insert(format!("* k k:{i}"), "0".to_owned());
            }
        }
        let app: Router = AdminApi::new(live.clone(), |raw| Some(Key::new(format!("k:{raw}"))))
            .token("s3cret")
            .router();
        let (status, body) = call(&app, "PUT", "/deny/newcomer", "10m").await;
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("100000"), "{body}");
        let (status, _) = call(&app, "PUT", "/allow-net/api/10.0.0.0%2F8", "").await;
        assert_eq!(status, 400);
        assert_eq!(live.lists().len(), super::super::MAX_LISTED);
        // An entry already listed may change.
        assert_eq!(call(&app, "PUT", "/deny/7", "1h").await.0, 204);
    }

    #[test]
    fn too_many_entries_are_a_bad_request() {
        let full = refused(ConfigError::TooManyListed { max: 100_000 }.into());
        assert_eq!(full.status(), StatusCode::BAD_REQUEST);
        let unknown = refused(
            ConfigError::UnknownPolicy {
                name: "nope".into(),
            }
            .into(),
        );
        assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn times_are_rfc3339() {
        let at = |ms| rfc3339(UNIX_EPOCH + Duration::from_millis(ms));
        let text = |s: &str| Some(s.to_owned());
        assert_eq!(at(0), text("1970-01-01T00:00:00.000Z"));
        assert_eq!(at(951_782_400_007), text("2000-02-29T00:00:00.007Z"));
        assert_eq!(at(1_700_000_000_123), text("2023-11-14T22:13:20.123Z"));
        assert_eq!(at(4_102_444_799_999), text("2099-12-31T23:59:59.999Z"));
        // Past the year 9999 (a heartbeat's stored time nobody meant).
        assert_eq!(at(253_402_300_800_000), None);
    }
}
