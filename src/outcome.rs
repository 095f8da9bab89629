//! What a layer did with one request ([`Outcome`]): counted by
//! [`metrics`](crate::metrics) and [`observe`](crate::observe) alike, so it
//! stands below both.

/// What a layer did with one request; the `outcome` label (the module
/// docs list its values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Outcome {
    /// Admitted by the limit.
    Allowed,
    /// Refused by the limit.
    Denied,
    /// Over the limit in shadow mode: admitted, only counted.
    ShadowDenied,
    /// Dropped by a load shedder (the fleet shedder's local fallback
    /// counts [`FallbackDenied`](Self::FallbackDenied) instead).
    Shed,
    /// No key could be extracted, and the request was refused.
    MissingKey,
    /// The store failed and the request was admitted (fail open).
    FailOpen,
    /// The store failed and the request was refused (fail closed).
    FailClosed,
    /// The store failed and the local fallback admitted the request.
    FallbackAllowed,
    /// The store failed and the local fallback refused the request.
    FallbackDenied,
    /// Refused by a deny list entry, without a decision.
    DenyListed,
    /// Let through by an allow list entry, without a decision.
    AllowListed,
}

impl Outcome {
    /// The outcome as counted for settings that are a local fallback's
    /// (`local`): an admission is `fallback_allowed`, a refusal (denied or
    /// shed) `fallback_denied`.
    pub(crate) fn by_fallback(self, local: bool) -> Outcome {
        match (local, self) {
            (true, Outcome::Allowed) => Outcome::FallbackAllowed,
            (true, Outcome::Denied | Outcome::Shed) => Outcome::FallbackDenied,
            (_, outcome) => outcome,
        }
    }
}

#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
impl Outcome {
    pub(crate) const ALL: [Outcome; 11] = [
        Outcome::Allowed,
        Outcome::Denied,
        Outcome::ShadowDenied,
        Outcome::Shed,
        Outcome::MissingKey,
        Outcome::FailOpen,
        Outcome::FailClosed,
        Outcome::FallbackAllowed,
        Outcome::FallbackDenied,
        Outcome::DenyListed,
        Outcome::AllowListed,
    ];

    /// The label value: `allowed`, `denied`, `shadow_denied`, `shed`,
    /// `missing_key`, `fail_open`, `fail_closed`, `fallback_allowed`,
    /// `fallback_denied`, `deny_listed`, `allow_listed`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::ShadowDenied => "shadow_denied",
            Outcome::Shed => "shed",
            Outcome::MissingKey => "missing_key",
            Outcome::FailOpen => "fail_open",
            Outcome::FailClosed => "fail_closed",
            Outcome::FallbackAllowed => "fallback_allowed",
            Outcome::FallbackDenied => "fallback_denied",
            Outcome::DenyListed => "deny_listed",
            Outcome::AllowListed => "allow_listed",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}
