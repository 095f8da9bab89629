/// Why a call was refused, for services that are not HTTP (the shed
/// layers' typed-error mode): the typed counterpart of a 503 response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShedError {
    /// The service is overloaded and sheds calls of this tier.
    #[error("overloaded: {tier} calls are being shed by {policy}")]
    Shed {
        /// The name of the shedder's policy.
        policy: String,
        /// The call's tier.
        tier: String,
    },
    /// The fleet shedder's store failed and the layer fails closed.
    #[error("load shedder unavailable: {0}")]
    Unavailable(String),
}
