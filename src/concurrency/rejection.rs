use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use super::ConcurrencyPolicy;
use crate::error::StoreError;
use crate::response::{grpc, retries, retry_after_secs};
use crate::store::LeaseGrant;

/// Why a [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer) refused a
/// request; handed to a custom rejection function.
#[derive(Debug)]
pub struct ConcurrencyRejection<'a> {
    pub(crate) kind: ConcurrencyRejectionKind,
    pub(crate) policy: &'a ConcurrencyPolicy,
    pub(crate) status: StatusCode,
    pub(crate) retry_after: Duration,
}

/// The reasons a concurrency limit refuses a request.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ConcurrencyRejectionKind {
    /// The identity already has the maximum in flight.
    InFlight(LeaseGrant),
    /// No key could be extracted; the layer rejects such requests with
    /// this status.
    MissingKey(StatusCode),
    /// The store failed and the layer fails closed.
    Unavailable(StoreError),
    /// A deny list entry refused the request
    /// ([`LivePolicies::deny`](crate::live::LivePolicies::deny)), with the
    /// layer's [`deny_status`](super::ConcurrencyLimitLayer::deny_status).
    DenyListed {
        /// The status to refuse with.
        status: StatusCode,
        /// When the entry ends; `None` if it has no end.
        retry_after: Option<Duration>,
    },
}

impl ConcurrencyRejection<'_> {
    /// The reason.
    pub fn kind(&self) -> &ConcurrencyRejectionKind {
        &self.kind
    }

    /// The policy of the layer that refused.
    pub fn policy(&self) -> &ConcurrencyPolicy {
        self.policy
    }

    /// The status the default response uses: the layer's configured status
    /// (429 unless changed) when too many are in flight, the missing-key
    /// or deny status, or 503 when the store is down.
    pub fn status(&self) -> StatusCode {
        match &self.kind {
            ConcurrencyRejectionKind::InFlight(_) => self.status,
            ConcurrencyRejectionKind::MissingKey(status) => *status,
            ConcurrencyRejectionKind::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ConcurrencyRejectionKind::DenyListed { status, .. } => *status,
        }
    }

    /// The `Retry-After` the default response sends when too many are in
    /// flight (the layer's setting, 1 s unless changed): a slot frees up as
    /// soon as any of the identity's requests ends, which nobody can
    /// predict.
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// The response fleetgate sends by default: the status, `Retry-After`
    /// (seconds, rounded up; 1 when the store is down) and a one-line text
    /// body. Custom rejection functions can start from it.
    pub fn default_response(&self) -> Response<Bytes> {
        let (body, retry) = match &self.kind {
            ConcurrencyRejectionKind::InFlight(_) => {
                let secs = retry_after_secs(self.retry_after);
                (
                    format!(
                        "too many requests in flight for {} (at most {}); retry in {secs} s\n",
                        self.policy.name(),
                        self.policy.max_in_flight()
                    ),
                    Some(secs),
                )
            }
            ConcurrencyRejectionKind::MissingKey(_) => (
                "concurrency limiting could not identify the client; the server's log says why\n"
                    .to_owned(),
                None,
            ),
            ConcurrencyRejectionKind::Unavailable(_) => (
                "concurrency limiter unavailable; retry shortly\n".to_owned(),
                Some(1),
            ),
            ConcurrencyRejectionKind::DenyListed {
                status,
                retry_after,
            } => (
                "access denied\n".to_owned(),
                retry_after
                    .filter(|_| retries(*status))
                    .map(retry_after_secs),
            ),
        };
        let mut response = Response::new(Bytes::from(body));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if let Some(secs) = retry {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }

    /// The refusal a layer in gRPC mode
    /// ([`ConcurrencyLimitLayer::grpc`](super::ConcurrencyLimitLayer::grpc))
    /// sends by default: HTTP 200, trailers-only, `grpc-status`
    /// `RESOURCE_EXHAUSTED` (8) when too many are in flight (whatever
    /// [`status`](Self::status) says), with `grpc-retry-pushback-ms`,
    /// `retry-after` and `grpc-status-details-bin` (a
    /// `google.rpc.RetryInfo`) from [`retry_after`](Self::retry_after);
    /// `UNAVAILABLE` (14) with a 1 s hint when the store is down; the gRPC
    /// code of the configured status for a missing key. `grpc-message`
    /// names the policy and its limit.
    pub fn grpc_response(&self) -> Response<Bytes> {
        let policy = self.policy.name();
        match &self.kind {
            ConcurrencyRejectionKind::InFlight(_) => grpc::refusal(
                grpc::RESOURCE_EXHAUSTED,
                &format!(
                    "too many calls in flight for concurrency policy {policy} (at most {})",
                    self.policy.max_in_flight()
                ),
                Some(Some(self.retry_after)),
            ),
            ConcurrencyRejectionKind::MissingKey(status) => grpc::refusal(
                grpc::code_for(*status),
                &format!(
                    "concurrency limiting (policy {policy}) could not identify the client; \
                     the server's log says why"
                ),
                None,
            ),
            ConcurrencyRejectionKind::Unavailable(_) => grpc::refusal(
                grpc::UNAVAILABLE,
                &format!("concurrency limiter unavailable (policy {policy}); retry shortly"),
                Some(Some(Duration::from_secs(1))),
            ),
            ConcurrencyRejectionKind::DenyListed {
                status,
                retry_after,
            } => grpc::refusal(
                grpc::code_for(*status),
                &format!("access denied (concurrency policy {policy})"),
                Some(retry_after.filter(|_| retries(*status))),
            ),
        }
    }
}
