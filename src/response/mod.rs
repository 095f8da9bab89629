//! HTTP pieces shared by the layers: rate-limit headers, rejection
//! responses and the response body type.

mod answer;
mod body;
pub(crate) mod grpc;
mod headers;
mod metered;
mod refusal;
mod rejection;
mod trailers;

pub use self::body::ResponseBody;
pub use self::headers::HeaderStyle;
#[doc(hidden)]
pub use self::metered::BodyMeter;
#[cfg(feature = "axum")]
pub(crate) use self::metered::Metered;
pub use self::refusal::RefusalBody;
pub use self::rejection::{Rejection, RejectionKind};

pub(crate) use self::answer::{Answer, Outcome};
pub(crate) use self::headers::PolicyHeaders;
pub(crate) use self::headers::retry_after_secs;
pub(crate) use self::rejection::retries;
#[cfg(feature = "grpc")]
pub(crate) use self::trailers::Watched;
pub(crate) use self::trailers::{TrailerWatch, WatchesTrailers};
