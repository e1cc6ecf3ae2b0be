//! The REST API under `/api/v1` (axum), its OpenAPI document and `/metrics`.
//!
//! Every change is a read-modify-apply of the configuration document under one lock: the
//! handler edits a copy of the running configuration, it is validated, and
//! [`Control::apply`] makes the target match and saves it. Errors are JSON
//! `{"error": "...", "field": "..."}`: 400 for a malformed request, 401 without the token,
//! 404 for an unknown object, 409 for a conflict, 413 for a body over the limit, 415 for
//! a body of another media type, 422 for a well-formed request the target cannot serve.
//!
//! Every listener authenticates its callers ([`crate::auth`]): a 401 for a missing or wrong
//! token, a 403 for a caller whose scope does not allow the request. Every change, and
//! every read of secrets, is logged with who made it.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{
    ConnectInfo, DefaultBodyLimit, Extension, FromRequest, FromRequestParts, Request, State,
};
use axum::http::{header, request::Parts, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, OpenApi, ToSchema};

use crate::alua::{Alua, AluaGroup, AluaLuState};
use crate::auth::{Caller, Guard, PeerCred, Scope};
use crate::config::{
    Acl, ApiConfig, Auth, Backstore, Config, Lun, MappedLun, Policy, PortAcl, PortalGroup, Target,
};
use crate::control::{AluaView, ChangeReport, Control, ControlError, RdmaView, SessionView};
use crate::nvme::{Nvme, NvmeNamespace, NvmePort, NvmeSubsystem};
use crate::resource::{
    each_kind, operation_id, request_name, template, Args, EachKind, Part, PathArgs, PortKind,
    Verb, API_PREFIX, OPERATIONS,
};

/// Largest request body accepted (a whole configuration document fits comfortably).
pub const BODY_LIMIT: usize = 1 << 20;

/// The JSON body of every error answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: String,
    /// The offending field, e.g. `size` or `targets[0].portal_groups[0].luns[1].backstore`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: ErrorBody,
}

impl ApiError {
    pub fn new(status: StatusCode, error: impl Into<String>, field: Option<&str>) -> ApiError {
        ApiError {
            status,
            body: ErrorBody {
                error: error.into(),
                field: field.map(str::to_string),
            },
        }
    }

    fn bad_request(error: impl Into<String>, field: Option<&str>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, error, field)
    }

    fn invalid(field: &str, error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, error, Some(field))
    }

    fn conflict(field: &str, error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, error, Some(field))
    }

    fn not_found(what: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, what, None)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(error = %self.body.error, "API request failed");
        }
        let mut r = (self.status, axum::Json(self.body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"rtgt\""),
            );
        }
        r
    }
}

impl From<ControlError> for ApiError {
    fn from(e: ControlError) -> ApiError {
        match e {
            ControlError::Invalid { field, message } => ApiError::invalid(&field, message),
            ControlError::Conflict { field, message } => ApiError::conflict(&field, message),
            ControlError::Forbidden { field, message } => {
                ApiError::new(StatusCode::FORBIDDEN, message, Some(&field))
            }
            ControlError::Internal(m) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, m, None),
        }
    }
}

impl From<BytesRejection> for ApiError {
    fn from(r: BytesRejection) -> ApiError {
        let status = r.status();
        let status = if status.is_server_error() {
            StatusCode::BAD_REQUEST
        } else {
            status
        };
        ApiError::new(status, r.body_text(), None)
    }
}

/// Parses `bytes` as JSON or YAML into `T`, naming the failing field.
fn parse_body<T: DeserializeOwned>(bytes: &[u8], yaml: bool) -> Result<T, ApiError> {
    fn field_of(path: String) -> Option<String> {
        (path != ".").then_some(path)
    }
    if yaml {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| ApiError::bad_request("the body is not UTF-8", None))?;
        let de = serde_norway::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let field = field_of(e.path().to_string());
            let msg = e.into_inner().to_string();
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, msg, field.as_deref())
        })
    } else {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let v = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let field = field_of(e.path().to_string());
            let inner = e.into_inner();
            let status = if inner.is_data() {
                StatusCode::UNPROCESSABLE_ENTITY
            } else {
                StatusCode::BAD_REQUEST
            };
            ApiError::new(status, inner.to_string(), field.as_deref())
        })?;
        de.end()
            .map_err(|e| ApiError::bad_request(e.to_string(), None))?;
        Ok(v)
    }
}

fn media_type(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
}

/// A JSON request body with field-naming errors.
pub struct Body<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match media_type(req.headers()).as_deref() {
            None | Some("application/json") => {}
            Some(other) => {
                return Err(ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    format!("expected application/json, not {other}"),
                    None,
                ))
            }
        }
        let bytes = Bytes::from_request(req, state).await?;
        parse_body(&bytes, false).map(Body)
    }
}

/// A configuration document in JSON or YAML.
pub struct Document(pub Config);

impl<S: Send + Sync> FromRequest<S> for Document {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let yaml = match media_type(req.headers()).as_deref() {
            Some("application/json") => false,
            None | Some("application/yaml" | "application/x-yaml" | "text/yaml") => true,
            Some(other) => {
                return Err(ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    format!("expected application/yaml or application/json, not {other}"),
                    None,
                ))
            }
        };
        let bytes = Bytes::from_request(req, state).await?;
        parse_body(&bytes, yaml).map(Document)
    }
}

/// Path parameters with JSON errors.
pub struct PathParams<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        use axum::extract::path::ErrorKind;
        use axum::extract::rejection::PathRejection;
        use axum::extract::RawPathParams;
        let names: Vec<String> = RawPathParams::from_request_parts(parts, state)
            .await
            .map(|raw| raw.iter().map(|(k, _)| k.to_string()).collect())
            .unwrap_or_default();
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| PathParams(p.0))
            .map_err(|e| {
                let field = match &e {
                    PathRejection::FailedToDeserializePathParams(d) => match d.kind() {
                        ErrorKind::ParseErrorAtKey { key, .. }
                        | ErrorKind::InvalidUtf8InPathParam { key } => Some(key.clone()),
                        ErrorKind::ParseErrorAtIndex { index, .. } => names.get(*index).cloned(),
                        _ => None,
                    },
                    _ => None,
                };
                ApiError::bad_request(e.body_text(), field.as_deref())
            })
    }
}

/// Query parameters with JSON errors.
pub struct QueryParams<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|p| QueryParams(p.0))
            .map_err(|e| ApiError::bad_request(e.body_text(), None))
    }
}

/// Shared by every listener's router: the handle and the lock that serializes changes.
#[derive(Clone)]
pub struct Api {
    control: Arc<dyn Control>,
    changes: Arc<tokio::sync::Mutex<()>>,
}

/// A router's state: the API and what its listener checks.
#[derive(Clone)]
struct AppState {
    api: Api,
    guard: Arc<Guard>,
}

type Res<T> = Result<T, ApiError>;
type St = State<AppState>;

/// Serves `router` on a TCP listener, over TLS with `tls`, until `shutdown` resolves.
pub async fn serve_tcp(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let service = router.into_make_service_with_connect_info::<crate::auth::Peer>();
    match tls {
        Some(config) => {
            let listener = crate::tls::TlsListener::new(listener, config)?;
            axum::serve(listener, service)
                .with_graceful_shutdown(shutdown)
                .await
        }
        None => {
            axum::serve(listener, service)
                .with_graceful_shutdown(shutdown)
                .await
        }
    }
}

/// Serves `router` on a unix socket until `shutdown` resolves; each connection's peer
/// credentials reach the router's guard.
pub async fn serve_unix(
    listener: tokio::net::UnixListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<PeerCred>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

/// The suffix of a configuration path below its innermost list element, e.g. `backstore`
/// for `targets[0].portal_groups[0].luns[1].backstore`.
fn short_field(path: &str) -> &str {
    match path.rfind("].") {
        Some(i) => &path[i + 2..],
        None => path,
    }
}

impl Api {
    pub fn new(control: Arc<dyn Control>) -> Api {
        Api {
            control,
            changes: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// The router for one listener, which admits callers as `guard` says: bearer tokens,
    /// peer credentials, or (a metrics listener) nobody but for `/metrics`.
    pub fn router(&self, guard: Guard) -> Router {
        let state = AppState {
            api: self.clone(),
            guard: Arc::new(guard),
        };
        if matches!(*state.guard, Guard::Metrics) {
            return Router::new()
                .route("/metrics", get(metrics))
                .fallback(not_found)
                .method_not_allowed_fallback(method_not_allowed)
                .layer(DefaultBodyLimit::max(BODY_LIMIT))
                .with_state(state);
        }
        let v1 = Router::new()
            .route("/backstores", get(list_backstores).post(create_backstore))
            .route(
                "/backstores/{name}",
                get(get_backstore)
                    .put(replace_backstore)
                    .delete(delete_backstore),
            )
            .route("/targets", get(list_targets).post(create_target))
            .route(
                "/targets/{target}",
                get(get_target).put(replace_target).delete(delete_target),
            )
            .route(
                "/targets/{target}/tpgs/{tag}/portals",
                get(list_portals).post(add_portal),
            )
            .route(
                "/targets/{target}/tpgs/{tag}/portals/{portal}",
                axum::routing::delete(delete_portal),
            )
            .route(
                "/targets/{target}/tpgs/{tag}/auth",
                get(get_tpg_auth).put(put_tpg_auth),
            )
            .route(
                "/targets/{target}/tpgs/{tag}/acls/{initiator}/auth",
                get(get_acl_auth).put(put_acl_auth),
            )
            .route(
                "/targets/{target}/tpgs/{tag}/acls/{initiator}/mapped_luns",
                axum::routing::post(add_mapped_lun),
            )
            .route(
                "/targets/{target}/tpgs/{tag}/acls/{initiator}/mapped_luns/{lun}",
                axum::routing::delete(delete_mapped_lun),
            )
            .route(
                "/discovery/auth",
                get(get_discovery_auth).put(put_discovery_auth),
            )
            .route("/nvme", get(get_nvme).put(put_nvme))
            .route(
                "/nvme/subsystems",
                get(list_subsystems).post(create_subsystem),
            )
            .route(
                "/nvme/subsystems/{nqn}",
                get(get_subsystem)
                    .put(replace_subsystem)
                    .delete(delete_subsystem),
            )
            .route(
                "/nvme/subsystems/{nqn}/namespaces",
                axum::routing::post(add_namespace),
            )
            .route(
                "/nvme/subsystems/{nqn}/namespaces/{nsid}",
                axum::routing::delete(delete_namespace),
            )
            .route(
                "/nvme/subsystems/{nqn}/hosts",
                axum::routing::post(add_host),
            )
            .route(
                "/nvme/subsystems/{nqn}/hosts/{host}",
                axum::routing::delete(delete_host),
            )
            .route("/nvme/ports", get(list_nvme_ports).post(add_nvme_port))
            .route("/nvme/ports/{id}", axum::routing::delete(delete_nvme_port))
            .route("/alua", get(get_alua).put(put_alua))
            .route("/alua/states", get(list_alua_states))
            .route(
                "/alua/groups/{id}/state",
                axum::routing::put(put_alua_state),
            )
            .route("/sessions", get(list_sessions))
            .route("/rdma", get(get_rdma))
            .route("/sessions/{id}", get(get_session).delete(delete_session))
            .route("/config", get(export_config).put(apply_config))
            .route("/openapi.json", get(openapi_json))
            .route("/health", get(health))
            .route("/ready", get(ready));
        let mut ports = PortRoutes(v1);
        each_kind(&mut ports);
        Router::new()
            .nest(API_PREFIX, ports.0)
            .route("/metrics", get(metrics))
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .layer(middleware::from_fn_with_state(state.clone(), authorize))
            .layer(DefaultBodyLimit::max(BODY_LIMIT))
            .with_state(state)
    }

    /// Applies a whole document as `PUT /api/v1/config` does, in turn with API changes (a
    /// configuration reload uses it).
    pub async fn apply(&self, config: Config) -> Result<ChangeReport, ControlError> {
        let _serial = self.changes.lock().await;
        let mut cfg = config;
        cfg.restore_secrets(&self.control.config());
        cfg.validate()
            .map_err(|(field, message)| ControlError::Invalid { field, message })?;
        cfg.resolve_defaults();
        self.control.apply(cfg).await
    }

    /// Edits a copy of the configuration with `f`, validates it and applies it.
    async fn change<T>(
        &self,
        what: &str,
        f: impl FnOnce(&mut Config) -> Res<T>,
    ) -> Res<(T, ChangeReport)> {
        let _serial = self.changes.lock().await;
        let current = self.control.config();
        let (out, cfg) = edited(&current, f)?;
        let report = self.control.apply(cfg).await?;
        tracing::info!(
            request = what,
            changes = report.changes.len(),
            "configuration changed"
        );
        Ok((out, report))
    }
}

/// A copy of `current` edited by `f`, as an apply would serve it: sections only the file
/// sets kept, `********` secrets restored, validated.
fn edited<T>(current: &Config, f: impl FnOnce(&mut Config) -> Res<T>) -> Res<(T, Config)> {
    let mut cfg = current.clone();
    let out = f(&mut cfg)?;
    keep_startup_sections(&mut cfg, current)?;
    cfg.restore_secrets(current);
    cfg.validate()
        .map_err(|(path, msg)| ApiError::invalid(short_field(&path), msg))?;
    cfg.resolve_defaults();
    Ok((out, cfg))
}

/// The `api` and `policy` sections say who may reach the API and what it may open: they
/// come from the configuration file, which only root can write, never from the API. A
/// document that leaves them out keeps the current ones.
fn keep_startup_sections(cfg: &mut Config, current: &Config) -> Res<()> {
    if cfg.api == ApiConfig::default() {
        cfg.api = current.api.clone();
    }
    if cfg.policy == Policy::default() {
        cfg.policy = current.policy.clone();
    }
    for (field, changed) in [
        ("api", cfg.api != current.api),
        ("policy", cfg.policy != current.policy),
    ] {
        if changed {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "the {field} section cannot change through the API: edit the configuration file as root and restart rtgtd"
                ),
                Some(field),
            ));
        }
    }
    Ok(())
}

/// The token of an `Authorization: Bearer` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// Answers a refused request once its body (at most [`BODY_LIMIT`] bytes) is read, so that
/// a client still sending it gets the answer instead of a reset connection.
async fn refuse(req: Request, e: ApiError) -> Response {
    let _ = axum::body::to_bytes(req.into_body(), BODY_LIMIT).await;
    e.into_response()
}

/// Admits the caller as the listener's guard says, checks that its scope allows the
/// request, and logs every change and every read of secrets with who made it.
async fn authorize(State(st): St, mut req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    // The health check and the API's own description are public: they tell nothing of
    // the target.
    let health = path == "/api/v1/health" || path == "/api/v1/openapi.json";
    let peer = req
        .extensions()
        .get::<ConnectInfo<crate::auth::Peer>>()
        .map(|c| c.0 .0);
    let (caller, scope) = match &*st.guard {
        Guard::Metrics => (Caller::Anonymous { peer }, Scope::Metrics),
        Guard::Socket(policy) => {
            let cred = req
                .extensions()
                .get::<ConnectInfo<PeerCred>>()
                .map(|c| c.0.clone())
                .unwrap_or_default();
            if !policy.admits(&cred) {
                tracing::warn!(uid = cred.uid, pid = cred.pid, method = %req.method(), path = %path, "API socket: caller refused");
                let e = ApiError::new(StatusCode::FORBIDDEN, policy.refusal(), None);
                return refuse(req, e).await;
            }
            (Caller::Socket(cred), Scope::Admin)
        }
        Guard::Tokens(_) if health => (Caller::Anonymous { peer }, Scope::Metrics),
        Guard::Tokens(tokens) => {
            let given = bearer(req.headers());
            match given.and_then(|g| tokens.check(g)) {
                Some((scope, name)) => (Caller::Token { name, peer }, scope),
                None => {
                    tracing::debug!(peer = ?peer, method = %req.method(), path = %path, "API: no valid token");
                    let why = if given.is_some() {
                        "the bearer token is not valid"
                    } else {
                        "a bearer token is required (Authorization: Bearer, from the api-token file)"
                    };
                    return refuse(req, ApiError::new(StatusCode::UNAUTHORIZED, why, None)).await;
                }
            }
        }
    };
    let method = req.method().clone();
    let changes = !matches!(method, Method::GET | Method::HEAD);
    let needed = if health || path == "/metrics" {
        Scope::Metrics
    } else if changes {
        Scope::Admin
    } else {
        Scope::Read
    };
    if scope < needed {
        tracing::info!(caller = %caller, method = %method, path = %path, "API request refused: scope");
        let e = ApiError::new(
            StatusCode::FORBIDDEN,
            "the read-only token cannot change the configuration: use the admin token",
            None,
        );
        return refuse(req, e).await;
    }
    let secrets = path == "/api/v1/config"
        && req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv.starts_with("secrets=")));
    req.extensions_mut().insert(scope);
    req.extensions_mut().insert(caller.clone());
    let response = next.run(req).await;
    if changes || secrets {
        tracing::info!(caller = %caller, method = %method, path = %path, secrets, status = response.status().as_u16(), "API request");
    }
    response
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such resource")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this resource",
        None,
    )
}

// ---- lookups ----

fn target_mut<'a>(c: &'a mut Config, name: &str) -> Res<&'a mut Target> {
    c.targets
        .iter_mut()
        .find(|t| t.name == name)
        .ok_or_else(|| ApiError::not_found(format!("no target {name:?}")))
}

/// Reads from the redacted configuration.
fn read<T>(st: &AppState, f: impl FnOnce(&mut Config) -> Res<T>) -> Res<axum::Json<T>> {
    let mut c = st.api.control.config().redacted();
    f(&mut c).map(axum::Json)
}

fn redact_auth(a: &Auth) -> Auth {
    let mut c = Config::default();
    c.discovery.auth = a.clone();
    c.redacted().discovery.auth
}

fn created<T: Serialize>(v: T) -> Response {
    (StatusCode::CREATED, axum::Json(v)).into_response()
}

fn no_content() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

// ---- backstores ----

#[utoipa::path(get, path = "/api/v1/backstores", tag = "backstores",
    responses((status = 200, body = Vec<Backstore>), (status = 401, body = ErrorBody)))]
async fn list_backstores(State(st): St) -> Res<axum::Json<Vec<Backstore>>> {
    read(&st, |c| Ok(std::mem::take(&mut c.backstores)))
}

#[utoipa::path(post, path = "/api/v1/backstores", tag = "backstores", request_body = Backstore,
    responses((status = 201, body = Backstore), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn create_backstore(State(st): St, Body(mut b): Body<Backstore>) -> Res<Response> {
    b.resolve_defaults();
    let (b, _) = st
        .api
        .change("create backstore", |c| {
            if c.backstore(&b.name).is_some() {
                return Err(ApiError::conflict(
                    "name",
                    format!("backstore {:?} exists", b.name),
                ));
            }
            c.backstores.push(b.clone());
            Ok(b)
        })
        .await?;
    Ok(created(b))
}

#[utoipa::path(get, path = "/api/v1/backstores/{name}", tag = "backstores",
    params(("name" = String, Path, description = "Backstore name")),
    responses((status = 200, body = Backstore), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn get_backstore(
    State(st): St,
    PathParams(name): PathParams<String>,
) -> Res<axum::Json<Backstore>> {
    read(&st, |c| {
        c.backstore(&name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(format!("no backstore {name:?}")))
    })
}

/// Replaces a backstore's definition. A backstore in use may change only its size (a live
/// resize: initiators get CAPACITY DATA HAS CHANGED).
#[utoipa::path(put, path = "/api/v1/backstores/{name}", tag = "backstores", request_body = Backstore,
    params(("name" = String, Path, description = "Backstore name")),
    responses((status = 200, body = Backstore), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn replace_backstore(
    State(st): St,
    PathParams(name): PathParams<String>,
    Body(mut b): Body<Backstore>,
) -> Res<axum::Json<Backstore>> {
    if b.name != name {
        return Err(ApiError::invalid("name", "the name cannot change"));
    }
    b.resolve_defaults();
    let (b, _) = st
        .api
        .change("replace backstore", |c| {
            let slot = c
                .backstores
                .iter_mut()
                .find(|x| x.name == name)
                .ok_or_else(|| ApiError::not_found(format!("no backstore {name:?}")))?;
            *slot = b.clone();
            Ok(b)
        })
        .await?;
    Ok(axum::Json(b))
}

#[utoipa::path(delete, path = "/api/v1/backstores/{name}", tag = "backstores",
    params(("name" = String, Path, description = "Backstore name")),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn delete_backstore(State(st): St, PathParams(name): PathParams<String>) -> Res<Response> {
    st.api
        .change("delete backstore", |c| {
            let i = c
                .backstores
                .iter()
                .position(|b| b.name == name)
                .ok_or_else(|| ApiError::not_found(format!("no backstore {name:?}")))?;
            if let Some((port, l)) = c.port_luns().find(|(_, l)| l.backstore == name) {
                return Err(ApiError::conflict(
                    "name",
                    format!("backstore {name:?} is in use: LUN {} of {port}", l.lun),
                ));
            }
            c.backstores.remove(i);
            Ok(())
        })
        .await?;
    Ok(no_content())
}

// ---- targets ----

#[utoipa::path(get, path = "/api/v1/targets", tag = "targets",
    responses((status = 200, body = Vec<Target>), (status = 401, body = ErrorBody)))]
async fn list_targets(State(st): St) -> Res<axum::Json<Vec<Target>>> {
    read(&st, |c| Ok(std::mem::take(&mut c.targets)))
}

#[utoipa::path(post, path = "/api/v1/targets", tag = "targets", request_body = Target,
    responses((status = 201, body = Target), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn create_target(State(st): St, Body(t): Body<Target>) -> Res<Response> {
    let (t, _) = st
        .api
        .change("create target", |c| {
            if c.targets
                .iter()
                .any(|x| x.name.eq_ignore_ascii_case(&t.name))
            {
                return Err(ApiError::conflict(
                    "name",
                    format!("target {:?} exists", t.name),
                ));
            }
            c.targets.push(t.clone());
            Ok(t)
        })
        .await?;
    Ok(created(redacted_target(t)))
}

fn redacted_target(t: Target) -> Target {
    let c = Config {
        targets: vec![t],
        ..Config::default()
    };
    c.redacted().targets.remove(0)
}

#[utoipa::path(get, path = "/api/v1/targets/{target}", tag = "targets",
    params(("target" = String, Path, description = "Target name")),
    responses((status = 200, body = Target), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn get_target(
    State(st): St,
    PathParams(name): PathParams<String>,
) -> Res<axum::Json<Target>> {
    read(&st, |c| target_mut(c, &name).map(|t| t.clone()))
}

#[utoipa::path(put, path = "/api/v1/targets/{target}", tag = "targets", request_body = Target,
    params(("target" = String, Path, description = "Target name")),
    responses((status = 200, body = Target), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn replace_target(
    State(st): St,
    PathParams(name): PathParams<String>,
    Body(t): Body<Target>,
) -> Res<axum::Json<Target>> {
    if t.name != name {
        return Err(ApiError::invalid("name", "the name cannot change"));
    }
    let (t, _) = st
        .api
        .change("replace target", |c| {
            *target_mut(c, &name)? = t.clone();
            Ok(t)
        })
        .await?;
    Ok(axum::Json(redacted_target(t)))
}

#[utoipa::path(delete, path = "/api/v1/targets/{target}", tag = "targets",
    params(("target" = String, Path, description = "Target name")),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn delete_target(State(st): St, PathParams(name): PathParams<String>) -> Res<Response> {
    st.api
        .change("delete target", |c| {
            target_mut(c, &name)?;
            c.targets.retain(|t| t.name != name);
            Ok(())
        })
        .await?;
    Ok(no_content())
}

// ---- ports of every fabric: iSCSI portal groups, SRP target ports ----
//
// The ports of every kind ([`crate::resource::PortKind`]) are served alike: a collection of
// ports, each with its LUN list and its ACL list. The handlers below serve every kind,
// [`port_routes`] routes them and [`document_ports`] describes them, from one list of
// operations.

/// The path parameters naming a port of kind `K`.
type At<K> = (<K as PortKind>::Parent, <K as PortKind>::Id);

/// The collection of ports of kind `K` that `parent` names.
fn ports_mut<'a, K: PortKind>(c: &'a mut Config, parent: &K::Parent) -> Res<&'a mut Vec<K>> {
    K::collection_mut(c, parent).map_err(ApiError::not_found)
}

fn port_mut<'a, K: PortKind>(c: &'a mut Config, (parent, id): &At<K>) -> Res<&'a mut K> {
    ports_mut::<K>(c, parent)?
        .iter_mut()
        .find(|p| p.id() == *id)
        .ok_or_else(|| ApiError::not_found(K::missing(parent, id)))
}

fn port_acl_mut<'a, K: PortKind>(
    c: &'a mut Config,
    at: &At<K>,
    initiator: &str,
) -> Res<&'a mut K::Acl> {
    port_mut::<K>(c, at)?
        .acls_mut()
        .iter_mut()
        .find(|a| a.names(initiator))
        .ok_or_else(|| ApiError::not_found(format!("no ACL for {initiator:?}")))
}

fn tpg_mut<'a>(c: &'a mut Config, target: &str, tag: u16) -> Res<&'a mut PortalGroup> {
    port_mut::<PortalGroup>(c, &(target.to_string(), tag))
}

fn acl_mut<'a>(c: &'a mut Config, target: &str, tag: u16, initiator: &str) -> Res<&'a mut Acl> {
    port_acl_mut::<PortalGroup>(c, &(target.to_string(), tag), initiator)
}

/// Applies the change `f` to the configuration, logged as the operation on `K` it is.
async fn change_port<K: PortKind, T>(
    st: &AppState,
    part: Part,
    verb: Verb,
    f: impl FnOnce(&mut Config) -> Res<T> + Send,
) -> Res<T> {
    let what = request_name::<K>(part, verb);
    Ok(st.api.change(&what, f).await?.0)
}

async fn list_ports<K: PortKind>(
    State(st): St,
    PathParams(Args(parent)): PathParams<Args<K::Parent>>,
) -> Res<axum::Json<Vec<K>>> {
    read(&st, |c| Ok(std::mem::take(ports_mut::<K>(c, &parent)?)))
}

async fn create_port<K: PortKind>(
    State(st): St,
    PathParams(Args(parent)): PathParams<Args<K::Parent>>,
    Body(p): Body<K>,
) -> Res<Response> {
    let p = change_port::<K, _>(&st, Part::Port, Verb::Add, |c| {
        let ports = ports_mut::<K>(c, &parent)?;
        if ports.iter().any(|x| x.id() == p.id()) {
            return Err(ApiError::conflict(
                K::ID,
                format!("{} exists", K::describe(&p.id())),
            ));
        }
        ports.push(p.clone());
        Ok(p)
    })
    .await?;
    Ok(created(p.redacted()))
}

async fn get_port<K: PortKind>(
    State(st): St,
    PathParams(Args(at)): PathParams<Args<At<K>>>,
) -> Res<axum::Json<K>> {
    read(&st, |c| port_mut::<K>(c, &at).map(|p| p.clone()))
}

async fn replace_port<K: PortKind>(
    State(st): St,
    PathParams(Args(at)): PathParams<Args<At<K>>>,
    Body(p): Body<K>,
) -> Res<axum::Json<K>> {
    if p.id() != at.1 {
        return Err(ApiError::invalid(
            K::ID,
            format!("the {} cannot change", K::ID),
        ));
    }
    let p = change_port::<K, _>(&st, Part::Port, Verb::Replace, |c| {
        *port_mut::<K>(c, &at)? = p.clone();
        Ok(p)
    })
    .await?;
    Ok(axum::Json(p.redacted()))
}

async fn delete_port<K: PortKind>(
    State(st): St,
    PathParams(Args(at)): PathParams<Args<At<K>>>,
) -> Res<Response> {
    change_port::<K, _>(&st, Part::Port, Verb::Delete, |c| {
        port_mut::<K>(c, &at)?;
        let ports = ports_mut::<K>(c, &at.0)?;
        if let Some(why) = K::KEEP_ONE.filter(|_| ports.len() == 1) {
            return Err(ApiError::conflict(K::ID, why));
        }
        ports.retain(|p| p.id() != at.1);
        Ok(())
    })
    .await?;
    Ok(no_content())
}

async fn list_luns<K: PortKind>(
    State(st): St,
    PathParams(Args(at)): PathParams<Args<At<K>>>,
) -> Res<axum::Json<Vec<Lun>>> {
    read(&st, |c| {
        Ok(std::mem::take(port_mut::<K>(c, &at)?.luns_mut()))
    })
}

async fn add_lun<K: PortKind>(
    State(st): St,
    PathParams(Args(at)): PathParams<Args<At<K>>>,
    Body(l): Body<Lun>,
) -> Res<Response> {
    change_port::<K, _>(&st, Part::Luns, Verb::Add, |c| {
        let luns = port_mut::<K>(c, &at)?.luns_mut();
        if luns.iter().any(|x| x.lun == l.lun) {
            return Err(ApiError::conflict("lun", format!("LUN {} is taken", l.lun)));
        }
        luns.push(l.clone());
        Ok(())
    })
    .await?;
    Ok(created(l))
}

async fn get_lun<K: PortKind>(
    State(st): St,
    PathParams(Args((at, lun))): PathParams<Args<(At<K>, u64)>>,
) -> Res<axum::Json<Lun>> {
    read(&st, |c| {
        port_mut::<K>(c, &at)?
            .luns()
            .iter()
            .find(|l| l.lun == lun)
            .cloned()
            .ok_or_else(|| ApiError::not_found(format!("no LUN {lun}")))
    })
}

async fn delete_lun<K: PortKind>(
    State(st): St,
    PathParams(Args((at, lun))): PathParams<Args<(At<K>, u64)>>,
) -> Res<Response> {
    change_port::<K, _>(&st, Part::Luns, Verb::Delete, |c| {
        let p = port_mut::<K>(c, &at)?;
        if !p.luns().iter().any(|l| l.lun == lun) {
            return Err(ApiError::not_found(format!("no LUN {lun}")));
        }
        if let Some(a) = p
            .acls()
            .iter()
            .find(|a| a.mapped_luns().iter().any(|m| m.tpg_lun == lun))
        {
            return Err(ApiError::conflict(
                "lun",
                format!("LUN {lun} is mapped {} {}", K::MAPPED_FOR, a.initiator()),
            ));
        }
        p.luns_mut().retain(|l| l.lun != lun);
        Ok(())
    })
    .await?;
    Ok(no_content())
}

async fn list_acls<K: PortKind>(
    State(st): St,
    PathParams(Args(at)): PathParams<Args<At<K>>>,
) -> Res<axum::Json<Vec<K::Acl>>> {
    read(&st, |c| {
        Ok(std::mem::take(port_mut::<K>(c, &at)?.acls_mut()))
    })
}

async fn add_acl<K: PortKind>(
    State(st): St,
    PathParams(Args(at)): PathParams<Args<At<K>>>,
    Body(a): Body<K::Acl>,
) -> Res<Response> {
    let mut a = change_port::<K, _>(&st, Part::Acls, Verb::Add, |c| {
        let acls = port_mut::<K>(c, &at)?.acls_mut();
        if acls
            .iter()
            .any(|x| x.initiator().eq_ignore_ascii_case(a.initiator()))
        {
            return Err(ApiError::conflict(
                "initiator",
                format!("an ACL for {:?} exists", a.initiator()),
            ));
        }
        acls.push(a.clone());
        Ok(a)
    })
    .await?;
    a.redact();
    Ok(created(a))
}

async fn get_acl<K: PortKind>(
    State(st): St,
    PathParams(Args((at, ini))): PathParams<Args<(At<K>, String)>>,
) -> Res<axum::Json<K::Acl>> {
    read(&st, |c| port_acl_mut::<K>(c, &at, &ini).map(|a| a.clone()))
}

async fn replace_acl<K: PortKind>(
    State(st): St,
    PathParams(Args((at, ini))): PathParams<Args<(At<K>, String)>>,
    Body(a): Body<K::Acl>,
) -> Res<axum::Json<K::Acl>> {
    if !a.names(&ini) {
        return Err(ApiError::invalid(
            "initiator",
            "the initiator cannot change",
        ));
    }
    let mut a = change_port::<K, _>(&st, Part::Acls, Verb::Replace, |c| {
        *port_acl_mut::<K>(c, &at, &ini)? = a.clone();
        Ok(a)
    })
    .await?;
    a.redact();
    Ok(axum::Json(a))
}

async fn delete_acl<K: PortKind>(
    State(st): St,
    PathParams(Args((at, ini))): PathParams<Args<(At<K>, String)>>,
) -> Res<Response> {
    change_port::<K, _>(&st, Part::Acls, Verb::Delete, |c| {
        port_acl_mut::<K>(c, &at, &ini)?;
        port_mut::<K>(c, &at)?.acls_mut().retain(|a| !a.names(&ini));
        Ok(())
    })
    .await?;
    Ok(no_content())
}

/// The routes of every operation on ports of kind `K` (each of [`OPERATIONS`]).
fn port_routes<K: PortKind>(router: Router<AppState>) -> Router<AppState> {
    let path = template::<K>;
    router
        .route(
            &path(Part::Port, Verb::List),
            get(list_ports::<K>).post(create_port::<K>),
        )
        .route(
            &path(Part::Port, Verb::Get),
            get(get_port::<K>)
                .put(replace_port::<K>)
                .delete(delete_port::<K>),
        )
        .route(
            &path(Part::Luns, Verb::List),
            get(list_luns::<K>).post(add_lun::<K>),
        )
        .route(
            &path(Part::Luns, Verb::Get),
            get(get_lun::<K>).delete(delete_lun::<K>),
        )
        .route(
            &path(Part::Acls, Verb::List),
            get(list_acls::<K>).post(add_acl::<K>),
        )
        .route(
            &path(Part::Acls, Verb::Get),
            get(get_acl::<K>)
                .put(replace_acl::<K>)
                .delete(delete_acl::<K>),
        )
}

/// Adds the routes of every kind of port.
struct PortRoutes(Router<AppState>);

impl EachKind for PortRoutes {
    fn kind<K: PortKind>(&mut self) {
        self.0 = port_routes::<K>(std::mem::take(&mut self.0));
    }
}

/// Describes every operation on ports of kind `K` in `doc`, as the `#[utoipa::path]`
/// attributes of the other handlers would.
fn document_ports<K: PortKind>(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::path::{HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn};
    use utoipa::openapi::request_body::RequestBodyBuilder;
    use utoipa::openapi::schema::ArrayBuilder;
    use utoipa::openapi::{ContentBuilder, Ref, RefOr, Required, ResponseBuilder, Schema};

    let json = |schema: RefOr<Schema>| ContentBuilder::new().schema(Some(schema)).build();
    let answer = |schema: Option<RefOr<Schema>>| {
        let r = ResponseBuilder::new().description("");
        match schema {
            Some(s) => r.content("application/json", json(s)).build(),
            None => r.build(),
        }
    };
    let error = || Some(Ref::from_schema_name("ErrorBody").into());
    for (part, verb) in OPERATIONS {
        let path = template::<K>(part, verb);
        let names: Vec<&str> = path
            .split('{')
            .skip(1)
            .filter_map(|p| p.split_once('}').map(|(name, _)| name))
            .collect();
        let mut schemas = Vec::new();
        <At<K>>::param_schemas(&mut schemas);
        let mut descriptions = K::PARAMS.to_vec();
        match part {
            Part::Port => {}
            Part::Luns => {
                u64::param_schemas(&mut schemas);
                descriptions.push("LUN");
            }
            Part::Acls => {
                String::param_schemas(&mut schemas);
                descriptions.push(K::INITIATOR);
            }
        }
        let member: RefOr<Schema> = Ref::from_schema_name(match part {
            Part::Port => K::name(),
            Part::Luns => Lun::name(),
            Part::Acls => K::Acl::name(),
        })
        .into();
        let mut op = OperationBuilder::new()
            .tag(K::tag(part))
            .summary(K::summary(part, verb))
            .operation_id(Some(operation_id::<K>(part, verb)));
        for ((name, description), schema) in names.iter().zip(&descriptions).zip(schemas) {
            op = op.parameter(
                ParameterBuilder::new()
                    .name(*name)
                    .parameter_in(ParameterIn::Path)
                    .description(Some(*description))
                    .required(Required::True)
                    .schema(Some(schema)),
            );
        }
        if matches!(verb, Verb::Add | Verb::Replace) {
            op = op.request_body(Some(
                RequestBodyBuilder::new()
                    .content("application/json", json(member.clone()))
                    .required(Some(Required::True))
                    .build(),
            ));
        }
        let (method, status, body, errors): (_, _, _, &[&str]) = match verb {
            Verb::List => (
                HttpMethod::Get,
                "200",
                Some(ArrayBuilder::new().items(member).into()),
                &[],
            ),
            Verb::Add => (
                HttpMethod::Post,
                "201",
                Some(member),
                &["409", "413", "415", "422"],
            ),
            Verb::Get => (HttpMethod::Get, "200", Some(member), &[]),
            Verb::Replace => (
                HttpMethod::Put,
                "200",
                Some(member),
                &["409", "413", "415", "422"],
            ),
            Verb::Delete => (HttpMethod::Delete, "204", None, &["409"]),
        };
        // A request is bad for its path parameters or its body; only path parameters can
        // name what is not there.
        let params = !names.is_empty();
        let bad = params || matches!(verb, Verb::Add | Verb::Replace);
        op = op.response(status, answer(body));
        for (e, present) in [("400", bad), ("401", true), ("404", params)]
            .into_iter()
            .chain(errors.iter().map(|e| (*e, true)))
        {
            if present {
                op = op.response(e, answer(error()));
            }
        }
        doc.paths
            .add_path_operation(format!("{API_PREFIX}{path}"), vec![method], op.build());
    }
}

/// Adds the operations on every kind of port to the OpenAPI document.
struct PortDocs;

impl utoipa::Modify for PortDocs {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        struct Each<'a>(&'a mut utoipa::openapi::OpenApi);
        impl EachKind for Each<'_> {
            fn kind<K: PortKind>(&mut self) {
                document_ports::<K>(self.0);
            }
        }
        each_kind(&mut Each(doc));
    }
}

// ---- portals ----

/// A portal address.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Portal {
    /// `address:port`, e.g. `0.0.0.0:3260` or `[::]:3260`.
    #[schema(value_type = String, example = "0.0.0.0:3260")]
    pub address: SocketAddr,
}

#[utoipa::path(get, path = "/api/v1/targets/{target}/tpgs/{tag}/portals", tag = "targets",
    params(("target" = String, Path, description = "Target name"),
        ("tag" = u16, Path, description = "Portal group tag")),
    responses((status = 200, body = Vec<Portal>), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn list_portals(
    State(st): St,
    PathParams((name, tag)): PathParams<(String, u16)>,
) -> Res<axum::Json<Vec<Portal>>> {
    read(&st, |c| {
        Ok(tpg_mut(c, &name, tag)?
            .portals
            .iter()
            .map(|a| Portal { address: *a })
            .collect())
    })
}

/// Adds a portal; its listener starts at once.
#[utoipa::path(post, path = "/api/v1/targets/{target}/tpgs/{tag}/portals", tag = "targets", request_body = Portal,
    params(("target" = String, Path, description = "Target name"),
        ("tag" = u16, Path, description = "Portal group tag")),
    responses((status = 201, body = Portal), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn add_portal(
    State(st): St,
    PathParams((name, tag)): PathParams<(String, u16)>,
    Body(p): Body<Portal>,
) -> Res<Response> {
    st.api
        .change("add portal", |c| {
            let t = target_mut(c, &name)?;
            if t.portal_groups
                .iter()
                .any(|g| g.portals.contains(&p.address))
            {
                return Err(ApiError::conflict(
                    "address",
                    format!("portal {} is already in the target", p.address),
                ));
            }
            tpg_mut(c, &name, tag)?.portals.push(p.address);
            Ok(())
        })
        .await?;
    Ok(created(p))
}

/// Removes a portal; its listener stops when no portal group uses the address any more.
#[utoipa::path(delete, path = "/api/v1/targets/{target}/tpgs/{tag}/portals/{portal}", tag = "targets",
    params(("target" = String, Path, description = "Target name"),
        ("tag" = u16, Path, description = "Portal group tag"),
        ("portal" = String, Path, description = "Portal address, e.g. 0.0.0.0:3260")),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn delete_portal(
    State(st): St,
    PathParams((name, tag, portal)): PathParams<(String, u16, String)>,
) -> Res<Response> {
    let addr: SocketAddr = portal.parse().map_err(|_| {
        ApiError::bad_request(format!("{portal:?} is not an address:port"), Some("portal"))
    })?;
    st.api
        .change("delete portal", |c| {
            let g = tpg_mut(c, &name, tag)?;
            if !g.portals.contains(&addr) {
                return Err(ApiError::not_found(format!("no portal {addr}")));
            }
            if g.portals.len() == 1 {
                return Err(ApiError::conflict(
                    "portal",
                    "a portal group needs at least one portal",
                ));
            }
            g.portals.retain(|p| *p != addr);
            Ok(())
        })
        .await?;
    Ok(no_content())
}

// ---- CHAP ----

#[utoipa::path(get, path = "/api/v1/targets/{target}/tpgs/{tag}/auth", tag = "auth",
    params(("target" = String, Path, description = "Target name"),
        ("tag" = u16, Path, description = "Portal group tag")),
    responses((status = 200, body = Auth, description = "Secrets are shown as ********"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
async fn get_tpg_auth(
    State(st): St,
    PathParams((name, tag)): PathParams<(String, u16)>,
) -> Res<axum::Json<Auth>> {
    read(&st, |c| tpg_mut(c, &name, tag).map(|g| g.auth.clone()))
}

/// Sets the CHAP credentials initiators of the portal group must present (an empty
/// object turns authentication off).
#[utoipa::path(put, path = "/api/v1/targets/{target}/tpgs/{tag}/auth", tag = "auth", request_body = Auth,
    params(("target" = String, Path, description = "Target name"),
        ("tag" = u16, Path, description = "Portal group tag")),
    responses((status = 200, body = Auth), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn put_tpg_auth(
    State(st): St,
    PathParams((name, tag)): PathParams<(String, u16)>,
    Body(a): Body<Auth>,
) -> Res<axum::Json<Auth>> {
    st.api
        .change("set portal group auth", |c| {
            tpg_mut(c, &name, tag)?.auth = a.clone();
            Ok(())
        })
        .await?;
    Ok(axum::Json(redact_auth(&a)))
}

#[utoipa::path(get, path = "/api/v1/targets/{target}/tpgs/{tag}/acls/{initiator}/auth", tag = "auth",
    params(("target" = String, Path, description = "Target name"),
        ("tag" = u16, Path, description = "Portal group tag"),
        ("initiator" = String, Path, description = "Initiator name")),
    responses((status = 200, body = Auth, description = "Secrets are shown as ********"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
async fn get_acl_auth(
    State(st): St,
    PathParams((name, tag, ini)): PathParams<(String, u16, String)>,
) -> Res<axum::Json<Auth>> {
    read(&st, |c| {
        acl_mut(c, &name, tag, &ini).map(|a| a.auth.clone())
    })
}

#[utoipa::path(put, path = "/api/v1/targets/{target}/tpgs/{tag}/acls/{initiator}/auth", tag = "auth", request_body = Auth,
    params(("target" = String, Path, description = "Target name"),
        ("tag" = u16, Path, description = "Portal group tag"),
        ("initiator" = String, Path, description = "Initiator name")),
    responses((status = 200, body = Auth), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn put_acl_auth(
    State(st): St,
    PathParams((name, tag, ini)): PathParams<(String, u16, String)>,
    Body(a): Body<Auth>,
) -> Res<axum::Json<Auth>> {
    st.api
        .change("set ACL auth", |c| {
            acl_mut(c, &name, tag, &ini)?.auth = a.clone();
            Ok(())
        })
        .await?;
    Ok(axum::Json(redact_auth(&a)))
}

#[utoipa::path(get, path = "/api/v1/discovery/auth", tag = "auth",
    responses((status = 200, body = Auth, description = "Secrets are shown as ********"),
        (status = 401, body = ErrorBody)))]
async fn get_discovery_auth(State(st): St) -> Res<axum::Json<Auth>> {
    read(&st, |c| Ok(c.discovery.auth.clone()))
}

#[utoipa::path(put, path = "/api/v1/discovery/auth", tag = "auth", request_body = Auth,
    responses((status = 200, body = Auth), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn put_discovery_auth(State(st): St, Body(a): Body<Auth>) -> Res<axum::Json<Auth>> {
    st.api
        .change("set discovery auth", |c| {
            c.discovery.auth = a.clone();
            Ok(())
        })
        .await?;
    Ok(axum::Json(redact_auth(&a)))
}

// ---- NVMe over Fabrics ----
//
// The `nvme` section whole, its subsystems (with their namespaces and allowed hosts) and its
// ports. Every change goes through the same apply as the configuration's: validated first
// (422 naming the field), live after.

#[utoipa::path(get, path = "/api/v1/nvme", tag = "nvme",
    responses((status = 200, body = Nvme), (status = 401, body = ErrorBody)))]
async fn get_nvme(State(st): St) -> Res<axum::Json<Nvme>> {
    read(&st, |c| Ok(std::mem::take(&mut c.nvme)))
}

/// Replaces the `nvme` section.
#[utoipa::path(put, path = "/api/v1/nvme", tag = "nvme", request_body = Nvme,
    responses((status = 200, body = Nvme), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn put_nvme(State(st): St, Body(n): Body<Nvme>) -> Res<axum::Json<Nvme>> {
    st.api
        .change("set nvme", |c| {
            c.nvme = n.clone();
            Ok(())
        })
        .await?;
    Ok(axum::Json(n))
}

fn subsystem_mut<'a>(c: &'a mut Config, nqn: &str) -> Res<&'a mut NvmeSubsystem> {
    c.nvme
        .subsystems
        .iter_mut()
        .find(|s| s.nqn == nqn)
        .ok_or_else(|| ApiError::not_found(format!("no NVMe subsystem {nqn:?}")))
}

#[utoipa::path(get, path = "/api/v1/nvme/subsystems", tag = "nvme",
    responses((status = 200, body = Vec<NvmeSubsystem>), (status = 401, body = ErrorBody)))]
async fn list_subsystems(State(st): St) -> Res<axum::Json<Vec<NvmeSubsystem>>> {
    read(&st, |c| Ok(std::mem::take(&mut c.nvme.subsystems)))
}

#[utoipa::path(post, path = "/api/v1/nvme/subsystems", tag = "nvme", request_body = NvmeSubsystem,
    responses((status = 201, body = NvmeSubsystem), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn create_subsystem(State(st): St, Body(s): Body<NvmeSubsystem>) -> Res<Response> {
    let (s, _) = st
        .api
        .change("create NVMe subsystem", |c| {
            if c.nvme.subsystems.iter().any(|x| x.nqn == s.nqn) {
                return Err(ApiError::conflict(
                    "nqn",
                    format!("NVMe subsystem {:?} exists", s.nqn),
                ));
            }
            c.nvme.subsystems.push(s.clone());
            Ok(s)
        })
        .await?;
    Ok(created(s))
}

#[utoipa::path(get, path = "/api/v1/nvme/subsystems/{nqn}", tag = "nvme",
    params(("nqn" = String, Path, description = "Subsystem NQN")),
    responses((status = 200, body = NvmeSubsystem), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn get_subsystem(
    State(st): St,
    PathParams(nqn): PathParams<String>,
) -> Res<axum::Json<NvmeSubsystem>> {
    read(&st, |c| subsystem_mut(c, &nqn).map(|s| s.clone()))
}

/// Replaces a subsystem: its hosts and namespaces as given (controllers of hosts no longer
/// admitted close; hosts hear of namespaces added and removed).
#[utoipa::path(put, path = "/api/v1/nvme/subsystems/{nqn}", tag = "nvme", request_body = NvmeSubsystem,
    params(("nqn" = String, Path, description = "Subsystem NQN")),
    responses((status = 200, body = NvmeSubsystem), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn replace_subsystem(
    State(st): St,
    PathParams(nqn): PathParams<String>,
    Body(s): Body<NvmeSubsystem>,
) -> Res<axum::Json<NvmeSubsystem>> {
    if s.nqn != nqn {
        return Err(ApiError::invalid("nqn", "the NQN cannot change"));
    }
    let (s, _) = st
        .api
        .change("replace NVMe subsystem", |c| {
            *subsystem_mut(c, &nqn)? = s.clone();
            Ok(s)
        })
        .await?;
    Ok(axum::Json(s))
}

/// Removes a subsystem; its controllers close.
#[utoipa::path(delete, path = "/api/v1/nvme/subsystems/{nqn}", tag = "nvme",
    params(("nqn" = String, Path, description = "Subsystem NQN")),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn delete_subsystem(State(st): St, PathParams(nqn): PathParams<String>) -> Res<Response> {
    st.api
        .change("delete NVMe subsystem", |c| {
            subsystem_mut(c, &nqn)?;
            c.nvme.subsystems.retain(|s| s.nqn != nqn);
            Ok(())
        })
        .await?;
    Ok(no_content())
}

/// Adds a namespace to a subsystem (its hosts hear of it).
#[utoipa::path(post, path = "/api/v1/nvme/subsystems/{nqn}/namespaces", tag = "nvme",
    request_body = NvmeNamespace,
    params(("nqn" = String, Path, description = "Subsystem NQN")),
    responses((status = 201, body = NvmeNamespace), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn add_namespace(
    State(st): St,
    PathParams(nqn): PathParams<String>,
    Body(n): Body<NvmeNamespace>,
) -> Res<Response> {
    let (n, _) = st
        .api
        .change("add NVMe namespace", |c| {
            let s = subsystem_mut(c, &nqn)?;
            if s.namespaces.iter().any(|x| x.nsid == n.nsid) {
                return Err(ApiError::conflict(
                    "nsid",
                    format!("{nqn} has namespace {}", n.nsid),
                ));
            }
            s.namespaces.push(n.clone());
            Ok(n)
        })
        .await?;
    Ok(created(n))
}

/// Removes a namespace from a subsystem (its hosts hear of it).
#[utoipa::path(delete, path = "/api/v1/nvme/subsystems/{nqn}/namespaces/{nsid}", tag = "nvme",
    params(("nqn" = String, Path, description = "Subsystem NQN"),
        ("nsid" = u32, Path, description = "Namespace ID")),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
async fn delete_namespace(
    State(st): St,
    PathParams((nqn, nsid)): PathParams<(String, u32)>,
) -> Res<Response> {
    st.api
        .change("remove NVMe namespace", |c| {
            let s = subsystem_mut(c, &nqn)?;
            let before = s.namespaces.len();
            s.namespaces.retain(|n| n.nsid != nsid);
            if s.namespaces.len() == before {
                return Err(ApiError::not_found(format!(
                    "{nqn} has no namespace {nsid}"
                )));
            }
            Ok(())
        })
        .await?;
    Ok(no_content())
}

/// A host NQN to admit.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct NvmeHost {
    #[schema(example = "nqn.2014-08.org.nvmexpress:uuid:5a1e0b2c-7d3f-4e21-9a6b-0c1d2e3f4a5b")]
    nqn: String,
}

/// Admits a host to a subsystem (one that admitted any host then admits only those listed).
#[utoipa::path(post, path = "/api/v1/nvme/subsystems/{nqn}/hosts", tag = "nvme",
    request_body = NvmeHost,
    params(("nqn" = String, Path, description = "Subsystem NQN")),
    responses((status = 201, body = NvmeHost), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn add_host(
    State(st): St,
    PathParams(nqn): PathParams<String>,
    Body(h): Body<NvmeHost>,
) -> Res<Response> {
    let (h, _) = st
        .api
        .change("admit NVMe host", |c| {
            let s = subsystem_mut(c, &nqn)?;
            if s.hosts.contains(&h.nqn) {
                return Err(ApiError::conflict(
                    "nqn",
                    format!("{nqn} admits {} already", h.nqn),
                ));
            }
            s.allow_any_host = false;
            s.hosts.push(h.nqn.clone());
            Ok(h)
        })
        .await?;
    Ok(created(h))
}

/// No longer admits a host: its controllers close at once.
#[utoipa::path(delete, path = "/api/v1/nvme/subsystems/{nqn}/hosts/{host}", tag = "nvme",
    params(("nqn" = String, Path, description = "Subsystem NQN"),
        ("host" = String, Path, description = "Host NQN")),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
async fn delete_host(
    State(st): St,
    PathParams((nqn, host)): PathParams<(String, String)>,
) -> Res<Response> {
    st.api
        .change("remove NVMe host", |c| {
            let s = subsystem_mut(c, &nqn)?;
            if !s.hosts.contains(&host) {
                return Err(ApiError::not_found(format!("{nqn} does not list {host}")));
            }
            s.hosts.retain(|h| *h != host);
            Ok(())
        })
        .await?;
    Ok(no_content())
}

#[utoipa::path(get, path = "/api/v1/nvme/ports", tag = "nvme",
    responses((status = 200, body = Vec<NvmePort>), (status = 401, body = ErrorBody)))]
async fn list_nvme_ports(State(st): St) -> Res<axum::Json<Vec<NvmePort>>> {
    read(&st, |c| Ok(std::mem::take(&mut c.nvme.ports)))
}

/// Adds a port: it listens once the change is applied (a taken address is a 409).
#[utoipa::path(post, path = "/api/v1/nvme/ports", tag = "nvme", request_body = NvmePort,
    responses((status = 201, body = NvmePort), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn add_nvme_port(State(st): St, Body(p): Body<NvmePort>) -> Res<Response> {
    let (p, _) = st
        .api
        .change("add NVMe port", |c| {
            if c.nvme.ports.iter().any(|x| x.id == p.id) {
                return Err(ApiError::conflict("id", format!("port {} exists", p.id)));
            }
            c.nvme.ports.push(p.clone());
            Ok(p)
        })
        .await?;
    Ok(created(p))
}

/// Removes a port: its listener stops and its connections end.
#[utoipa::path(delete, path = "/api/v1/nvme/ports/{id}", tag = "nvme",
    params(("id" = u16, Path, description = "Port ID")),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
async fn delete_nvme_port(State(st): St, PathParams(id): PathParams<u16>) -> Res<Response> {
    st.api
        .change("remove NVMe port", |c| {
            if !c.nvme.ports.iter().any(|p| p.id == id) {
                return Err(ApiError::not_found(format!("no NVMe port {id}")));
            }
            c.nvme.ports.retain(|p| p.id != id);
            Ok(())
        })
        .await?;
    Ok(no_content())
}

// ---- ALUA ----

#[utoipa::path(get, path = "/api/v1/alua", tag = "alua",
    responses((status = 200, body = Alua, description = "Target port groups as configured"),
        (status = 401, body = ErrorBody)))]
async fn get_alua(State(st): St) -> Res<axum::Json<Alua>> {
    read(&st, |c| Ok(c.alua.clone()))
}

/// Replaces the `alua` section. Refused with 409 when a LUN would be left with no active
/// group, or a group that allows only explicit changes would change state.
#[utoipa::path(put, path = "/api/v1/alua", tag = "alua", request_body = Alua,
    responses((status = 200, body = Alua), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn put_alua(State(st): St, Body(a): Body<Alua>) -> Res<axum::Json<Alua>> {
    st.api
        .change("set alua", |c| {
            c.alua = a.clone();
            Ok(())
        })
        .await?;
    Ok(axum::Json(a))
}

/// Every logical unit's target port groups with their states now (what REPORT TARGET PORT
/// GROUPS answers): the configured state, or the one SET TARGET PORT GROUPS set since.
#[utoipa::path(get, path = "/api/v1/alua/states", tag = "alua",
    responses((status = 200, body = Vec<AluaView>), (status = 401, body = ErrorBody)))]
async fn list_alua_states(State(st): St) -> axum::Json<Vec<AluaView>> {
    axum::Json(st.api.control.alua().await)
}

/// A change of a target port group's state, for all its LUNs or for one backstore's.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct AluaStateChange {
    /// active_optimized, active_non_optimized, standby, unavailable, offline or
    /// transitioning.
    #[schema(example = "standby")]
    state: String,
    /// PREF; unchanged when absent.
    #[serde(default)]
    preferred: Option<bool>,
    /// Only this backstore's LUNs; the group's state when absent.
    #[serde(default)]
    backstore: Option<String>,
}

/// Sets the access state of a target port group (what a cluster manager does on failover):
/// every initiator hears ASYMMETRIC ACCESS STATE CHANGED, and the configuration keeps it.
/// The state is set even where the configuration said so already (SET TARGET PORT GROUPS
/// may have moved it); where gateways share the states (an rbd image), on all of them.
/// Changes are applied one at a time; one that would leave a LUN with no active group is
/// refused with 409.
#[utoipa::path(put, path = "/api/v1/alua/groups/{id}/state", tag = "alua",
    request_body = AluaStateChange,
    params(("id" = u16, Path, description = "Target port group")),
    responses((status = 200, body = AluaGroup), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn put_alua_state(
    State(st): St,
    PathParams(id): PathParams<u16>,
    Body(ch): Body<AluaStateChange>,
) -> Res<axum::Json<AluaGroup>> {
    let state = rtgt_scsi::AccessState::from_name(&ch.state).ok_or_else(|| {
        ApiError::invalid(
            "state",
            format!("{:?} is not an access state (active_optimized, active_non_optimized, standby, unavailable, offline, transitioning)", ch.state),
        )
    })?;
    let (g, _) = st
        .api
        .change("set alua state", |c| {
            if let Some(b) = &ch.backstore {
                if c.backstore(b).is_none() {
                    return Err(ApiError::not_found(format!("no backstore {b:?}")));
                }
            }
            let g = c
                .alua
                .groups
                .iter_mut()
                .find(|g| g.id == id)
                .ok_or_else(|| ApiError::not_found(format!("no target port group {id}")))?;
            match &ch.backstore {
                None => {
                    g.state = state;
                    if let Some(p) = ch.preferred {
                        g.preferred = p;
                    }
                }
                Some(b) => {
                    let was = g.backstores.iter().find(|o| o.backstore == *b);
                    let preferred = ch.preferred.or(was.and_then(|o| o.preferred));
                    g.backstores.retain(|o| o.backstore != *b);
                    // A backstore's state like the group's is no override.
                    if state != g.state || preferred.is_some_and(|p| p != g.preferred) {
                        g.backstores.push(AluaLuState {
                            backstore: b.clone(),
                            state,
                            preferred,
                        });
                    }
                }
            }
            Ok(g.clone())
        })
        .await?;
    st.api
        .control
        .set_alua_state(id, ch.backstore.as_deref(), state)
        .await?;
    Ok(axum::Json(g))
}

// ---- mapped LUNs of iSCSI ACLs ----

#[utoipa::path(post, path = "/api/v1/targets/{target}/tpgs/{tag}/acls/{initiator}/mapped_luns", tag = "acls",
    request_body = MappedLun,
    params(("target" = String, Path, description = "Target name"),
        ("tag" = u16, Path, description = "Portal group tag"),
        ("initiator" = String, Path, description = "Initiator name")),
    responses((status = 201, body = MappedLun), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn add_mapped_lun(
    State(st): St,
    PathParams((name, tag, ini)): PathParams<(String, u16, String)>,
    Body(m): Body<MappedLun>,
) -> Res<Response> {
    st.api
        .change("add mapped LUN", |c| {
            let a = acl_mut(c, &name, tag, &ini)?;
            if a.mapped_luns.iter().any(|x| x.lun == m.lun) {
                return Err(ApiError::conflict(
                    "lun",
                    format!("LUN {} is taken for {ini}", m.lun),
                ));
            }
            a.mapped_luns.push(m.clone());
            Ok(())
        })
        .await?;
    Ok(created(m))
}

#[utoipa::path(delete, path = "/api/v1/targets/{target}/tpgs/{tag}/acls/{initiator}/mapped_luns/{lun}", tag = "acls",
    params(("target" = String, Path, description = "Target name"),
        ("tag" = u16, Path, description = "Portal group tag"),
        ("initiator" = String, Path, description = "Initiator name"),
        ("lun" = u64, Path, description = "LUN the initiator sees")),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn delete_mapped_lun(
    State(st): St,
    PathParams((name, tag, ini, lun)): PathParams<(String, u16, String, u64)>,
) -> Res<Response> {
    st.api
        .change("delete mapped LUN", |c| {
            let a = acl_mut(c, &name, tag, &ini)?;
            if !a.mapped_luns.iter().any(|m| m.lun == lun) {
                return Err(ApiError::not_found(format!("no mapped LUN {lun}")));
            }
            a.mapped_luns.retain(|m| m.lun != lun);
            Ok(())
        })
        .await?;
    Ok(no_content())
}

// ---- sessions ----

#[utoipa::path(get, path = "/api/v1/sessions", tag = "sessions",
    responses((status = 200, body = Vec<SessionView>), (status = 401, body = ErrorBody)))]
async fn list_sessions(State(st): St) -> axum::Json<Vec<SessionView>> {
    axum::Json(st.api.control.sessions())
}

/// The RDMA provider (`soft` or `verbs`), the device of each address it serves, and the iSER
/// and SRP listeners with their devices.
#[utoipa::path(get, path = "/api/v1/rdma", tag = "sessions",
    responses((status = 200, body = RdmaView), (status = 401, body = ErrorBody)))]
async fn get_rdma(State(st): St) -> axum::Json<RdmaView> {
    axum::Json(st.api.control.rdma())
}

/// One session (an NVMe controller with each of its queues).
#[utoipa::path(get, path = "/api/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "Session id from the session list")),
    responses((status = 200, body = SessionView), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
async fn get_session(
    State(st): St,
    PathParams(id): PathParams<String>,
) -> Res<axum::Json<SessionView>> {
    st.api
        .control
        .sessions()
        .into_iter()
        .find(|s| s.id == id)
        .map(axum::Json)
        .ok_or_else(|| ApiError::not_found(format!("no session {id:?}")))
}

/// Ends a session at once: an iSCSI initiator is told with an Async Message, an SRP
/// initiator with SRP_T_LOGOUT on each channel before the disconnect.
#[utoipa::path(delete, path = "/api/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "Session id from the session list")),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
async fn delete_session(State(st): St, PathParams(id): PathParams<String>) -> Res<Response> {
    if st.api.control.force_logout(&id) {
        tracing::info!(session = %id, "session ended by the administrator");
        Ok(no_content())
    } else {
        Err(ApiError::not_found(format!("no session {id:?}")))
    }
}

// ---- configuration ----

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
struct ExportQuery {
    /// Include CHAP secrets instead of `********`.
    secrets: Option<bool>,
}

#[utoipa::path(get, path = "/api/v1/config", tag = "config", params(ExportQuery),
    responses((status = 200, body = Config), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
async fn export_config(
    State(st): St,
    scope: Option<Extension<Scope>>,
    QueryParams(q): QueryParams<ExportQuery>,
) -> Res<axum::Json<Config>> {
    let c = st.api.control.config();
    if q.secrets == Some(true) {
        if scope.map(|s| s.0) != Some(Scope::Admin) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "reading secrets takes the admin token",
                Some("secrets"),
            ));
        }
        Ok(axum::Json(c))
    } else {
        Ok(axum::Json(c.redacted()))
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
struct ApplyQuery {
    /// Validate the document as an apply would and answer with what it would change,
    /// changing nothing.
    dry_run: Option<bool>,
}

/// Applies a whole configuration document (YAML or JSON): only what differs changes.
/// Secrets given as `********` keep their current value. With `dry_run=true` the document
/// is validated the same way and the answer lists what applying it would change.
#[utoipa::path(put, path = "/api/v1/config", tag = "config", params(ApplyQuery),
    request_body(content(
        (Config = "application/json"),
        (Config = "application/yaml"))),
    responses((status = 200, body = ChangeReport), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn apply_config(
    State(st): St,
    QueryParams(q): QueryParams<ApplyQuery>,
    Document(new): Document,
) -> Res<axum::Json<ChangeReport>> {
    if q.dry_run == Some(true) {
        let current = st.api.control.config();
        let ((), cfg) = edited(&current, |c| {
            *c = new;
            Ok(())
        })?;
        return Ok(axum::Json(crate::diff::diff(&current, &cfg)));
    }
    let (_, report) = st
        .api
        .change("apply configuration", |c| {
            *c = new;
            Ok(())
        })
        .await?;
    Ok(axum::Json(report))
}

// ---- health, readiness, metrics, OpenAPI ----

/// Health and readiness.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Status {
    /// `ok` or `starting`.
    pub status: String,
}

#[utoipa::path(get, path = "/api/v1/health", tag = "health",
    responses((status = 200, body = Status)))]
async fn health() -> axum::Json<Status> {
    axum::Json(Status {
        status: "ok".into(),
    })
}

#[utoipa::path(get, path = "/api/v1/ready", tag = "health",
    responses((status = 200, body = Status), (status = 401, body = ErrorBody),
        (status = 503, body = Status)))]
async fn ready(State(st): St) -> Response {
    if st.api.control.ready() {
        axum::Json(Status {
            status: "ok".into(),
        })
        .into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(Status {
                status: "starting".into(),
            }),
        )
            .into_response()
    }
}

#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain"),
        (status = 401, body = ErrorBody)))]
async fn metrics(State(st): St) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        st.api.control.metrics(),
    )
        .into_response()
}

#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "health",
    responses((status = 200, description = "This document", content_type = "application/json")))]
async fn openapi_json() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        openapi().to_pretty_json().unwrap_or_default(),
    )
        .into_response()
}

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::HttpMethod;
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        // Every operation but the health check may be refused: 401 without a valid token,
        // 403 for a caller whose scope does not allow it.
        let error = |what: &str| {
            ResponseBuilder::new()
                .description(what)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build()
        };
        for (path, item) in doc.paths.paths.iter_mut() {
            if path == "/api/v1/health" || path == "/api/v1/openapi.json" {
                continue;
            }
            for method in [
                HttpMethod::Get,
                HttpMethod::Put,
                HttpMethod::Post,
                HttpMethod::Delete,
            ] {
                let op = match method {
                    HttpMethod::Get => item.get.as_mut(),
                    HttpMethod::Put => item.put.as_mut(),
                    HttpMethod::Post => item.post.as_mut(),
                    _ => item.delete.as_mut(),
                };
                let Some(op) = op else { continue };
                let r = &mut op.responses.responses;
                r.entry("401".into())
                    .or_insert_with(|| error("No valid bearer token").into());
                r.entry("403".into()).or_insert_with(|| {
                    error("The caller may not do this: a read-only token, a socket peer outside the admitted users, or a section only the configuration file sets").into()
                });
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "rtgt administration API", description = "Backstores, targets, portal groups, LUNs, ACLs, CHAP, SRP target ports, sessions of every transport and the configuration document of a running rtgtd."),
    paths(
        list_backstores, create_backstore, get_backstore, replace_backstore, delete_backstore,
        list_targets, create_target, get_target, replace_target, delete_target,
        list_portals, add_portal, delete_portal,
        get_tpg_auth, put_tpg_auth, get_acl_auth, put_acl_auth, get_discovery_auth, put_discovery_auth,
        add_mapped_lun, delete_mapped_lun,
        get_alua, put_alua, list_alua_states, put_alua_state,
        get_nvme, put_nvme, list_subsystems, create_subsystem, get_subsystem, replace_subsystem,
        delete_subsystem, add_namespace, delete_namespace, add_host, delete_host,
        list_nvme_ports, add_nvme_port, delete_nvme_port,
        list_sessions, get_session, delete_session, get_rdma,
        export_config, apply_config,
        health, ready, metrics, openapi_json,
    ),
    components(schemas(ErrorBody, Status, Portal, ApiConfig, AluaStateChange, NvmeHost)),
    modifiers(&PortDocs, &BearerAuth),
    security(("bearer" = []))
)]
struct ApiDoc;

/// The OpenAPI document of this API.
pub fn openapi() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openapi_lists_every_route() {
        let doc = openapi();
        let json = doc.to_json().unwrap();
        for p in [
            "/api/v1/backstores/{name}",
            "/api/v1/targets/{target}/tpgs/{tag}/acls/{initiator}/mapped_luns/{lun}",
            "/api/v1/sessions/{id}",
            "/api/v1/srp/ports/{name}/acls/{initiator}",
            "/api/v1/srp/ports/{name}/luns/{lun}",
            "/api/v1/config",
            "/api/v1/nvme/subsystems/{nqn}/namespaces/{nsid}",
            "/api/v1/nvme/subsystems/{nqn}/hosts/{host}",
            "/api/v1/nvme/ports/{id}",
            "/metrics",
        ] {
            assert!(doc.paths.paths.contains_key(p), "{p} missing");
        }
        // Secrets appear in answers only as `********`, which the schema's description
        // says (a writeOnly property would make those answers violate the document).
        assert!(!json.contains("writeOnly"));
        assert!(json.contains("********"));
        assert!(json.contains("bearer"));
    }

    /// A running target that takes every configuration it is given.
    struct Taker(std::sync::Mutex<Config>);

    #[async_trait::async_trait]
    impl Control for Taker {
        fn config(&self) -> Config {
            self.0.lock().unwrap().clone()
        }
        async fn apply(&self, config: Config) -> Result<ChangeReport, ControlError> {
            *self.0.lock().unwrap() = config;
            Ok(ChangeReport::default())
        }
        fn sessions(&self) -> Vec<SessionView> {
            Vec::new()
        }
        fn force_logout(&self, _: &str) -> bool {
            false
        }
        fn rdma(&self) -> RdmaView {
            RdmaView {
                provider: "none".into(),
                ..RdmaView::default()
            }
        }
        fn ready(&self) -> bool {
            true
        }
        fn metrics(&self) -> String {
            String::new()
        }
        async fn alua(&self) -> Vec<AluaView> {
            Vec::new()
        }
        async fn set_alua_state(
            &self,
            group: u16,
            _: Option<&str>,
            _: rtgt_scsi::AccessState,
        ) -> Result<(), ControlError> {
            match self
                .0
                .lock()
                .unwrap()
                .alua
                .groups
                .iter()
                .any(|g| g.id == group)
            {
                true => Ok(()),
                false => Err(ControlError::Invalid {
                    field: "alua".into(),
                    message: format!("no target port group {group}"),
                }),
            }
        }
    }

    #[tokio::test]
    async fn ports_of_every_fabric_are_served_alike() {
        use tower::ServiceExt;
        let cfg = Config::from_yaml(
            "backstores: [{name: a, type: null, size: 1M}]\ntargets:\n  - name: iqn.2025-01.io.rtgt:t\n    portal_groups: [{tag: 1, portals: ['127.0.0.1:3260']}]\nsrp: [{name: p0}]\n",
            std::path::Path::new("t.yaml"),
        )
        .unwrap();
        let token = "a".repeat(64);
        let router = Api::new(Arc::new(Taker(std::sync::Mutex::new(cfg)))).router(Guard::Tokens(
            crate::auth::Tokens {
                admin: token.clone().into(),
                read: "b".repeat(64).into(),
            },
        ));
        let call = |method: &str, path: String, body: &str| {
            let req = Request::builder()
                .method(method)
                .uri(path)
                .header(header::AUTHORIZATION, format!("Bearer {token}"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(axum::body::Body::from(body.to_string()))
                .unwrap();
            let router = router.clone();
            async move {
                let r = router.oneshot(req).await.unwrap();
                let status = r.status().as_u16();
                let body = axum::body::to_bytes(r.into_body(), BODY_LIMIT)
                    .await
                    .unwrap();
                (status, String::from_utf8_lossy(&body).into_owned())
            }
        };
        let tpg = "/api/v1/targets/iqn.2025-01.io.rtgt:t/tpgs";
        let srp = "/api/v1/srp/ports";
        let ini = "iqn.1994-05.com.redhat:h";
        let port = "0x0000000000000000505400fffe123403";
        let port_upper = port.to_uppercase().replacen("0X", "0x", 1);
        let chap = r#"{"chap":{"user":"u","secret":"secret-secret-1"}}"#;
        let redacted = r#"{"chap":{"user":"u","secret":"********"}}"#;
        let mapped = r#"[{"lun":1,"tpg_lun":0}]"#;
        let error = |message: &str, field: &str| {
            let field = if field.is_empty() {
                String::new()
            } else {
                format!(r#","field":"{field}""#)
            };
            format!(r#"{{"error":{message:?}{field}}}"#)
        };
        let lun0 = r#"{"lun":0,"backstore":"a"}"#;
        let cases = [
            (
                "POST",
                tpg.to_string(),
                r#"{"tag":1,"portals":["127.0.0.2:1"]}"#.to_string(),
                409,
                error("portal group 1 exists", "tag"),
            ),
            (
                "POST",
                srp.to_string(),
                r#"{"name":"p0"}"#.into(),
                409,
                error("SRP target port \"p0\" exists", "name"),
            ),
            (
                "PUT",
                format!("{srp}/p0"),
                r#"{"name":"p1"}"#.into(),
                422,
                error("the name cannot change", "name"),
            ),
            (
                "GET",
                format!("{tpg}/2"),
                String::new(),
                404,
                error("target \"iqn.2025-01.io.rtgt:t\" has no portal group 2", ""),
            ),
            (
                "GET",
                format!("{srp}/p1/luns"),
                String::new(),
                404,
                error("no SRP target port \"p1\"", ""),
            ),
            (
                "GET",
                format!("{tpg}/x/luns"),
                String::new(),
                400,
                error(
                    "Invalid URL: Cannot parse value at index 1 with value `x` to a `u16`",
                    "tag",
                ),
            ),
            (
                "GET",
                format!("{srp}/p0/luns/x"),
                String::new(),
                400,
                error(
                    "Invalid URL: Cannot parse value at index 1 with value `x` to a `u64`",
                    "lun",
                ),
            ),
            (
                "POST",
                format!("{tpg}/1/luns"),
                lun0.into(),
                201,
                lun0.into(),
            ),
            (
                "POST",
                format!("{srp}/p0/luns"),
                lun0.into(),
                201,
                lun0.into(),
            ),
            (
                "POST",
                format!("{srp}/p0/luns"),
                lun0.into(),
                409,
                error("LUN 0 is taken", "lun"),
            ),
            (
                "POST",
                format!("{tpg}/1/acls"),
                format!(r#"{{"initiator":"{ini}","auth":{chap},"mapped_luns":{mapped}}}"#),
                201,
                format!(r#"{{"initiator":"{ini}","auth":{redacted},"mapped_luns":{mapped}}}"#),
            ),
            (
                "POST",
                format!("{srp}/p0/acls"),
                format!(r#"{{"initiator":"{port}","mapped_luns":{mapped}}}"#),
                201,
                format!(r#"{{"initiator":"{port}","mapped_luns":{mapped}}}"#),
            ),
            (
                "POST",
                format!("{srp}/p0/acls"),
                format!(r#"{{"initiator":"{port_upper}"}}"#),
                409,
                error(&format!("an ACL for {port_upper:?} exists"), "initiator"),
            ),
            // iSCSI names are looked up as written, SRP port identifiers in any case.
            (
                "GET",
                format!("{tpg}/1/acls/{}", ini.to_uppercase()),
                String::new(),
                404,
                error(&format!("no ACL for {:?}", ini.to_uppercase()), ""),
            ),
            (
                "GET",
                format!("{srp}/p0/acls/{port_upper}"),
                String::new(),
                200,
                format!(r#"{{"initiator":"{port}","mapped_luns":{mapped}}}"#),
            ),
            (
                "DELETE",
                format!("{tpg}/1/luns/0"),
                String::new(),
                409,
                error(&format!("LUN 0 is mapped in the ACL of {ini}"), "lun"),
            ),
            (
                "DELETE",
                format!("{srp}/p0/luns/0"),
                String::new(),
                409,
                error(&format!("LUN 0 is mapped for {port}"), "lun"),
            ),
            (
                "PUT",
                format!("{tpg}/1/acls/{ini}"),
                format!(r#"{{"initiator":"{ini}","auth":{chap}}}"#),
                200,
                format!(r#"{{"initiator":"{ini}","auth":{redacted}}}"#),
            ),
            (
                "DELETE",
                format!("{srp}/p0/acls/{port_upper}"),
                String::new(),
                204,
                String::new(),
            ),
            (
                "DELETE",
                format!("{srp}/p0/luns/0"),
                String::new(),
                204,
                String::new(),
            ),
            (
                "DELETE",
                format!("{tpg}/1"),
                String::new(),
                409,
                error(
                    "a target needs at least one portal group: delete the target instead",
                    "tag",
                ),
            ),
            (
                "DELETE",
                format!("{srp}/p0"),
                String::new(),
                204,
                String::new(),
            ),
            ("GET", srp.to_string(), String::new(), 200, "[]".into()),
        ];
        for (method, path, body, status, answer) in cases {
            assert_eq!(
                call(method, path.clone(), &body).await,
                (status, answer),
                "{method} {path}"
            );
        }
    }

    #[test]
    fn short_fields() {
        assert_eq!(
            short_field("targets[0].portal_groups[0].luns[1].backstore"),
            "backstore"
        );
        assert_eq!(
            short_field("backstores[2].auth.chap.secret"),
            "auth.chap.secret"
        );
        assert_eq!(
            short_field("discovery.auth.chap.secret"),
            "discovery.auth.chap.secret"
        );
    }

    #[test]
    fn bodies_name_their_field() {
        let e = parse_body::<Backstore>(br#"{"name":"a","type":"tape"}"#, false).unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(e.body.field.as_deref(), Some("type"));
        let e = parse_body::<Backstore>(br#"{"name":"a","#, false).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let e = parse_body::<Config>(b"backstores:\n  - {name: a, type: null, sise: 1}\n", true)
            .unwrap_err();
        assert_eq!(e.body.field.as_deref(), Some("backstores[0].sise"));
        let e = parse_body::<Lun>(br#"{"lun":0,"backstore":"a"} x"#, false).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }
}
