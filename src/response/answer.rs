//! How the layers that admit by lease (the concurrency limiter, the load
//! shedders) turn what happened to a request into a response or an error.

use bytes::Bytes;
use http::Response;

use super::ResponseBody;
use crate::error::BoxError;
use crate::lease::{GuardedBody, Lease, LeaseGuard, StoreLease};

/// How a layer answers the requests it refuses.
pub(crate) trait Answer: Send + Sync + 'static {
    /// Why a request was refused.
    type Refusal;

    /// The HTTP response to a refusal.
    fn respond(&self, refusal: Self::Refusal) -> Response<Bytes>;

    /// The typed error for a refusal.
    fn fail(&self, refusal: Self::Refusal) -> BoxError;
}

/// How a request ended, before the mode turns it into a response or error:
/// passed (holding a lease of type `L`, if any) or refused.
pub(crate) enum Outcome<R, E, F, L: Lease = StoreLease> {
    Passed(Result<R, E>, Option<LeaseGuard<L>>),
    Rejected(F),
}

impl<R, E, F, L: Lease> Outcome<R, E, F, L> {
    pub(crate) fn passed(&self) -> bool {
        matches!(self, Outcome::Passed(..))
    }

    /// Typed-error mode: there is no body to follow, so the lease ends here.
    pub(crate) fn into_typed<A>(self, answer: &A) -> Result<R, BoxError>
    where
        A: Answer<Refusal = F>,
        E: Into<BoxError>,
    {
        match self {
            Outcome::Passed(result, _guard) => result.map_err(Into::into),
            Outcome::Rejected(refusal) => Err(answer.fail(refusal)),
        }
    }
}

impl<B, E, F, L: Lease> Outcome<Response<B>, E, F, L> {
    /// HTTP mode: the response body holds the lease from here on.
    pub(crate) fn into_http<A>(
        self,
        answer: &A,
    ) -> Result<Response<GuardedBody<ResponseBody<B>, L>>, E>
    where
        A: Answer<Refusal = F>,
    {
        match self {
            Outcome::Passed(result, guard) => {
                result.map(|r| r.map(|body| GuardedBody::new(ResponseBody::inner(body), guard)))
            }
            Outcome::Rejected(refusal) => Ok(answer
                .respond(refusal)
                .map(|body| GuardedBody::new(ResponseBody::full(body), None))),
        }
    }
}
