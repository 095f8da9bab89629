use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use super::grpc;
use super::headers::{PolicyHeaders, integer_value, retry_after_secs};
use crate::decision::Decision;
use crate::error::StoreError;
use crate::policy::Policy;
use crate::text::concat;

/// Why a layer refused a request; handed to a custom rejection function.
#[derive(Debug)]
pub struct Rejection<'a> {
    pub(crate) kind: RejectionKind,
    pub(crate) policy: &'a Policy,
    pub(crate) headers: &'a PolicyHeaders,
}

/// The reasons a request is refused.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum RejectionKind {
    /// A limit denied the request.
    Limited(Decision),
    /// No key could be extracted; the layer rejects such requests with
    /// this status.
    MissingKey(StatusCode),
    /// The store failed and the layer fails closed.
    Unavailable(StoreError),
    /// A deny list entry refused the request
    /// ([`LivePolicies::deny`](crate::live::LivePolicies::deny)), with the
    /// layer's [`deny_status`](crate::RateLimitLayer::deny_status).
    DenyListed {
        /// The status to refuse with.
        status: StatusCode,
        /// When the entry ends; `None` if it has no end.
        retry_after: Option<Duration>,
    },
}

impl Rejection<'_> {
    /// The reason.
    pub fn kind(&self) -> &RejectionKind {
        &self.kind
    }

    /// The policy of the layer that refused.
    pub fn policy(&self) -> &Policy {
        self.policy
    }

    /// The name of the limit that denied, if a limit did.
    pub fn limit_name(&self) -> Option<&str> {
        match &self.kind {
            RejectionKind::Limited(d) => {
                self.policy.limits().get(d.limit_index()).map(|l| l.name())
            }
            _ => None,
        }
    }

    /// The status the default response uses: 429 when limited, the
    /// configured status for a missing key or a deny list entry, 503 when
    /// the store is down.
    pub fn status(&self) -> StatusCode {
        match &self.kind {
            RejectionKind::Limited(_) => StatusCode::TOO_MANY_REQUESTS,
            RejectionKind::MissingKey(status) => *status,
            RejectionKind::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            RejectionKind::DenyListed { status, .. } => *status,
        }
    }

    /// The response fleetgate sends by default: the status, `Retry-After`
    /// (seconds, rounded up) when a retry can help, the rate-limit headers,
    /// and a one-line text body. Custom rejection functions can start from
    /// it.
    pub fn default_response(&self) -> Response<Bytes> {
        // The texts are put together without the formatting machinery: a
        // 429 costs one allocation for its body, the other refusals none.
        let body = match &self.kind {
            RejectionKind::Limited(d) => {
                let name = self.limit_name().unwrap_or("limit");
                match d.retry_after() {
                    Some(after) => {
                        let mut digits = itoa::Buffer::new();
                        let secs = digits.format(retry_after_secs(after));
                        let parts = ["rate limit ", name, " exceeded; retry in ", secs, " s\n"];
                        Bytes::from(concat(&parts))
                    }
                    None => Bytes::from(format!(
                        "request cost exceeds rate limit {name}; it can never be admitted\n"
                    )),
                }
            }
            RejectionKind::MissingKey(_) => Bytes::from_static(
                b"rate limiting could not identify the client; the server's log says why\n",
            ),
            RejectionKind::Unavailable(_) => {
                Bytes::from_static(b"rate limiter unavailable; retry shortly\n")
            }
            RejectionKind::DenyListed { .. } => Bytes::from_static(b"access denied\n"),
        };
        let mut response = Response::new(body);
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        match &self.kind {
            RejectionKind::Limited(d) => {
                // Without a retry-after the call can never pass, and the
                // key's state was not read: no numbers to report.
                if let Some(after) = d.retry_after() {
                    headers.insert(RETRY_AFTER, integer_value(retry_after_secs(after)));
                    self.headers.write(headers, d);
                }
            }
            RejectionKind::Unavailable(_) => {
                headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
            }
            RejectionKind::MissingKey(_) => {}
            // Only a refusal that a retry can pass says when: a 429 (or
            // 503) for an entry with an end.
            RejectionKind::DenyListed {
                status,
                retry_after: Some(after),
            } if retries(*status) => {
                headers.insert(RETRY_AFTER, integer_value(retry_after_secs(*after)));
            }
            RejectionKind::DenyListed { .. } => {}
        }
        response
    }

    /// The refusal a layer in gRPC mode ([`RateLimitLayer::grpc`](crate::RateLimitLayer::grpc))
    /// sends by default: HTTP 200, trailers-only, `grpc-status`
    /// `RESOURCE_EXHAUSTED` (8) with `grpc-retry-pushback-ms`,
    /// `retry-after`, `grpc-status-details-bin` (a `google.rpc.RetryInfo`)
    /// and the rate-limit headers when a limit denied; `UNAVAILABLE` (14)
    /// with a 1 s retry hint when the store is down; the gRPC code of the
    /// configured status for a missing key (400 is `INVALID_ARGUMENT`, 401
    /// `UNAUTHENTICATED`). `grpc-message` names the policy and the limit. A
    /// call that can never pass is told not to retry
    /// (`grpc-retry-pushback-ms: -1`).
    pub fn grpc_response(&self) -> Response<Bytes> {
        let policy = self.policy.name();
        match &self.kind {
            RejectionKind::Limited(d) => {
                let name = self.limit_name().unwrap_or("limit");
                let message = match d.retry_after() {
                    Some(_) => concat(&["rate limit ", name, " of policy ", policy, " exceeded"]),
                    None => concat(&[
                        "request cost exceeds rate limit ",
                        name,
                        " of policy ",
                        policy,
                        "; it can never be admitted",
                    ]),
                };
                let mut response =
                    grpc::refusal(grpc::RESOURCE_EXHAUSTED, &message, Some(d.retry_after()));
                if d.retry_after().is_some() {
                    self.headers.write(response.headers_mut(), d);
                }
                response
            }
            RejectionKind::MissingKey(status) => grpc::refusal(
                grpc::code_for(*status),
                &concat(&[
                    "rate limiting (policy ",
                    policy,
                    ") could not identify the client; the server's log says why",
                ]),
                None,
            ),
            RejectionKind::Unavailable(_) => grpc::refusal(
                grpc::UNAVAILABLE,
                &concat(&[
                    "rate limiter unavailable (policy ",
                    policy,
                    "); retry shortly",
                ]),
                Some(Some(Duration::from_secs(1))),
            ),
            RejectionKind::DenyListed {
                status,
                retry_after,
            } => grpc::refusal(
                grpc::code_for(*status),
                &concat(&["access denied (policy ", policy, ")"]),
                Some(retry_after.filter(|_| retries(*status))),
            ),
        }
    }
}

/// Whether a refusal with `status` may pass when retried later.
pub(crate) fn retries(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE
}
