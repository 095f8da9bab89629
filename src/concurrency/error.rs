/// Why a call was refused, for services that are not HTTP (the layer's
/// typed-error mode): the typed counterpart of a 429 response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConcurrencyLimitError {
    /// The identity already has the maximum in flight.
    #[error("too many calls in flight for {limit} (at most {max_in_flight})")]
    InFlight {
        /// The name of the concurrency policy.
        limit: String,
        /// Its maximum.
        max_in_flight: u64,
    },
    /// No key could be extracted from the call and the layer was told to
    /// reject such calls.
    #[error("no concurrency-limit key could be extracted from the call")]
    MissingKey,
    /// The store failed and the layer fails closed.
    #[error("concurrency limiter unavailable: {0}")]
    Unavailable(String),
    /// A deny list entry names the call's key
    /// ([`LivePolicies::deny`](crate::live::LivePolicies::deny)).
    #[error("denied by a deny list entry{}", retry_after.map(|d| format!(" ending in {d:?}")).unwrap_or_default())]
    Denied {
        /// When the entry ends; `None` if it has no end.
        retry_after: Option<std::time::Duration>,
    },
}
