//! How a [`Policy`](crate::Policy) decides: GCRA (the default) or one of
//! the window algorithms, one file each. Each file is the one definition
//! of what its algorithm does for every operation (check, peek, charge,
//! refund, and defer where it applies), as pure functions of (state, now,
//! parameters), with its unit tests at its end; `lua/<algorithm>.lua`
//! transcribes it for Redis, function by function.

use std::fmt;

pub(crate) mod block;
pub(crate) mod budget;
pub(crate) mod calendar;
pub(crate) mod fixed_window;
pub(crate) mod gcra;
pub(crate) mod sliding_log;
pub(crate) mod sliding_window;
pub(crate) mod window;

/// The most limits one policy may hold: the algorithms keep a call's
/// figures per limit in arrays of this size.
pub(crate) const MAX_LIMITS_PER_POLICY: usize = 16;

/// The algorithm a policy's limits are decided with, chosen with one line:
/// [`PolicyBuilder::algorithm`](crate::PolicyBuilder::algorithm).
///
/// Under a window algorithm each limit of the policy is a window: `Rate::new(25,
/// 5 s)` admits a total cost of 25 per 5 s window, and a policy of several
/// limits checks every window in one step, all-or-nothing (a call denied by
/// one window charges none). A window's quota is its rate's count, so the
/// builder refuses a limit whose burst was set to anything else.
///
/// | algorithm | state per identity | exactness | choose it for |
/// |---|---|---|---|
/// | [`Gcra`](Algorithm::Gcra) (default) | one number per limit | exact rate with a burst | most APIs: cheapest, smooth; the only one with reserve mode (waiting clients) |
/// | [`SlidingLog`](Algorithm::SlidingLog) | one timestamp per admitted unit of cost, in one sorted set for all windows | exact: at most `count` in any window of that length | mirroring an upstream's published "N per window" exactly, for small N |
/// | [`SlidingWindow`](Algorithm::SlidingWindow) | two counters per limit | approximate: the previous window's count weighted by how much of it still overlaps the sliding window | very large counts or very many identities, in O(1) memory |
/// | [`FixedWindow`](Algorithm::FixedWindow) | one counter per limit | exact per window, but up to twice the count can pass around a window boundary | quotas that reset at fixed times |
/// | [`Calendar`](Algorithm::Calendar) | one counter per limit | exact per calendar day or month, in a time zone | paid plans' quotas ("10,000 calls a month"), resetting when the customer expects |
///
/// What each costs in Redis memory and decisions per second is in
/// BENCHMARKS.md ("What it costs"). In Redis, sliding-log members are
/// `<time>-<n>`, `n` counting the members already logged in that
/// microsecond, chosen inside the script, so they are unique across
/// processes and machines; a denied call is never logged.
///
/// What the decision (and so the rate-limit headers) reports, per
/// algorithm, for the limit that decided:
///
/// | algorithm | remaining (`r`, `X-RateLimit-Remaining`) | reset (`t`, `X-RateLimit-Reset`) | retry after a denial |
/// |---|---|---|---|
/// | GCRA | calls of cost 1 the burst still holds | until the burst is full again | until the call's cost fits the burst |
/// | sliding log | `count` minus the cost logged in the last window length | until the newest logged call leaves the window | until enough of the oldest logged calls have left the window for this call to fit |
/// | sliding window | `count` minus the weighted estimate, rounded down | until the estimate is zero again (the current window's calls have fully decayed) | until the estimate leaves room for this call |
/// | fixed window | `count` minus the cost in the current window | until the current window ends | until the current window ends |
/// | calendar | `count` minus the cost in the current day or month | until the next calendar boundary in the zone | until the next calendar boundary |
///
/// `RateLimit-Policy` advertises each window as `q=<count>;w=<seconds>`.
/// A policy of several windows reports every window: `RateLimit` lists them
/// all, and [`Decision::remaining_of`](crate::Decision::remaining_of) and
/// [`Decision::reset_of`](crate::Decision::reset_of) give each one's figures.
/// Windows are aligned to the clock's epoch (Unix time with Redis' clock),
/// and window lengths are whole microseconds (rounded up).
///
/// Reserve mode ([`Limiter::reserve`](crate::Limiter::reserve)) needs GCRA;
/// window policies refuse it with
/// [`ConfigError::ReserveNeedsGcra`](crate::ConfigError::ReserveNeedsGcra).
///
/// ```
/// use std::time::Duration;
/// use fleetgate::{Algorithm, Key, Limit, Limiter, MemoryStore, Policy, Rate};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // An upstream that publishes "25 per 5 s and 300 per minute", mirrored exactly.
/// let upstream = Policy::builder("upstream")
///     .algorithm(Algorithm::SlidingLog)
///     .limit(Limit::new(Rate::new(25, Duration::from_secs(5)))?)
///     .limit(Limit::new(Rate::per_minute(300))?)
///     .build()?;
/// let limiter = Limiter::new(upstream, MemoryStore::new());
/// let me = Key::new("worker");
/// for _ in 0..25 {
///     assert!(limiter.check(&me, 1).await?.is_allowed());
/// }
/// let denied = limiter.check(&me, 1).await?;
/// assert!(!denied.is_allowed());
/// // The 5-second window denied: retry when the oldest call leaves it,
/// // 5 s after it was made.
/// assert_eq!(limiter.policy().limits()[denied.limit_index()].name(), "25/5s");
/// assert!(denied.retry_after().unwrap() <= Duration::from_secs(5));
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// The generic cell rate algorithm: a rate with a burst, one number per
    /// limit. The default.
    #[default]
    Gcra,
    /// Sliding-window log: the exact count of the last window length, from
    /// the timestamps of admitted calls. Memory grows with the count.
    SlidingLog,
    /// Sliding-window counter: the current fixed window's count plus the
    /// previous one's, weighted by overlap. O(1) memory, approximate.
    SlidingWindow,
    /// Fixed window: one counter per window, reset when the window ends.
    /// O(1) memory.
    FixedWindow,
    /// Calendar quota: one counter per limit, reset at the start of each
    /// calendar day or month in the limit's time zone (see
    /// [`Limit::calendar`](crate::Limit::calendar)). O(1) memory. A policy
    /// of calendar limits takes this algorithm by itself.
    Calendar,
}

impl Algorithm {
    /// Whether this is one of the window algorithms.
    pub fn is_window(self) -> bool {
        !matches!(self, Algorithm::Gcra)
    }

    /// A short name: `gcra`, `sliding-log`, `sliding-window`,
    /// `fixed-window`, `calendar`.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Gcra => "gcra",
            Algorithm::SlidingLog => "sliding-log",
            Algorithm::SlidingWindow => "sliding-window",
            Algorithm::FixedWindow => "fixed-window",
            Algorithm::Calendar => "calendar",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
