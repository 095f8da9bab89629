use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use super::ShedError;
use super::tier::{Tier, Tiers};
use crate::error::BoxError;
use crate::error::StoreError;
use crate::response::Answer;
use crate::response::{grpc, retry_after_secs};

/// Why a load shedder refused a request; handed to a custom rejection
/// function.
#[derive(Debug)]
pub struct ShedRejection<'a> {
    pub(crate) kind: ShedRejectionKind,
    pub(crate) tier: Tier,
    pub(crate) tiers: &'a Tiers,
    pub(crate) policy: &'a str,
    pub(crate) retry_after: Duration,
}

/// The reasons a load shedder refuses a request.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ShedRejectionKind {
    /// Fleet shedder: the whole fleet had `in_flight` requests in flight,
    /// as many as the request's tier may use.
    OverLimit {
        /// Requests in flight across the fleet.
        in_flight: u64,
        /// The tier's limit.
        limit: u64,
    },
    /// Worker-utilization shedder: this process is overloaded and drops
    /// requests of the tier with this probability.
    Dropped {
        /// The tier's drop probability, from 0 to 1.
        probability: f64,
    },
    /// Fleet shedder: the store failed and the layer fails closed (or a
    /// response future was polled after it completed).
    Unavailable(StoreError),
}

impl ShedRejection<'_> {
    /// The reason.
    pub fn kind(&self) -> &ShedRejectionKind {
        &self.kind
    }

    /// The request's tier.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// The name of the request's tier.
    pub fn tier_name(&self) -> &str {
        self.tiers.name(self.tier)
    }

    /// The name of the shedder's policy.
    pub fn policy(&self) -> &str {
        self.policy
    }

    /// The status the default response uses: always
    /// `503 Service Unavailable` (the service, not the client, is the
    /// problem).
    pub fn status(&self) -> StatusCode {
        StatusCode::SERVICE_UNAVAILABLE
    }

    /// The `Retry-After` the default response sends: the layer's setting
    /// when shed, 1 s when the store is down.
    pub fn retry_after(&self) -> Duration {
        match self.kind {
            ShedRejectionKind::Unavailable(_) => Duration::from_secs(1),
            _ => self.retry_after,
        }
    }

    /// The response fleetgate sends by default: 503, `Retry-After`
    /// (seconds, rounded up) and a one-line text body. Custom rejection
    /// functions can start from it.
    pub fn default_response(&self) -> Response<Bytes> {
        let secs = retry_after_secs(self.retry_after());
        let body = match &self.kind {
            ShedRejectionKind::Unavailable(_) => {
                "load shedder unavailable; retry shortly\n".to_owned()
            }
            _ => format!(
                "overloaded: {} traffic is being shed; retry in {secs} s\n",
                self.tier_name()
            ),
        };
        let mut response = Response::new(Bytes::from(body));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        response
    }

    /// The refusal a layer in gRPC mode sends by default
    /// ([`FleetShedLayer::grpc`](crate::shed::FleetShedLayer::grpc),
    /// [`UtilizationShedLayer::grpc`](crate::shed::UtilizationShedLayer::grpc)):
    /// HTTP 200, trailers-only, `grpc-status` `UNAVAILABLE` (14), with
    /// `grpc-retry-pushback-ms`, `retry-after` and
    /// `grpc-status-details-bin` (a `google.rpc.RetryInfo`) from
    /// [`retry_after`](Self::retry_after). `grpc-message` names the policy
    /// and the tier (and, for the fleet shedder, the tier's limit).
    pub fn grpc_response(&self) -> Response<Bytes> {
        let message = match &self.kind {
            ShedRejectionKind::Unavailable(_) => format!(
                "load shedder unavailable (policy {}); retry shortly",
                self.policy
            ),
            ShedRejectionKind::OverLimit { limit, .. } => format!(
                "overloaded: {} traffic is being shed (policy {}, at most {limit} in flight)",
                self.tier_name(),
                self.policy
            ),
            ShedRejectionKind::Dropped { .. } => format!(
                "overloaded: {} traffic is being shed (policy {})",
                self.tier_name(),
                self.policy
            ),
        };
        grpc::refusal(grpc::UNAVAILABLE, &message, Some(Some(self.retry_after())))
    }
}

pub(crate) type ShedRejectFn = Arc<dyn Fn(&ShedRejection<'_>) -> Response<Bytes> + Send + Sync>;

/// A refused request: its tier and why.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) tier: Tier,
    pub(crate) kind: ShedRejectionKind,
}

/// How both shed layers answer the requests they refuse.
#[derive(Clone)]
pub(crate) struct ShedAnswer {
    pub(crate) policy: Arc<str>,
    pub(crate) tiers: Tiers,
    pub(crate) retry_after: Duration,
    pub(crate) rejection: Option<ShedRejectFn>,
    /// Refusals are gRPC statuses (the layers' `grpc()`).
    pub(crate) grpc: bool,
}

impl Answer for ShedAnswer {
    type Refusal = Refusal;

    fn respond(&self, refusal: Refusal) -> Response<Bytes> {
        let rejection = ShedRejection {
            kind: refusal.kind,
            tier: refusal.tier,
            tiers: &self.tiers,
            policy: &self.policy,
            retry_after: self.retry_after,
        };
        match &self.rejection {
            Some(custom) => custom(&rejection),
            None if self.grpc => rejection.grpc_response(),
            None => rejection.default_response(),
        }
    }

    fn fail(&self, refusal: Refusal) -> BoxError {
        Box::new(match refusal.kind {
            ShedRejectionKind::Unavailable(err) => ShedError::Unavailable(err.to_string()),
            _ => ShedError::Shed {
                policy: self.policy.to_string(),
                tier: self.tiers.name(refusal.tier).to_owned(),
            },
        })
    }
}
