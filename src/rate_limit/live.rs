//! A layer's settings for one limiter, following the limiter's live rules:
//! the settings of its policy, and of each identity or plan with limits of
//! their own, rebuilt when the rules change.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

use super::{RateSettings, RejectFn, ResponseCost};
use crate::key::Key;
use crate::layer::{FailurePolicy, OnMissingKey};
use crate::limiter::Limiter;
use crate::lists::{Lists, Verdict};
use crate::metrics::LayerMetrics;
use crate::policy::Policy;
use crate::response::{HeaderStyle, PolicyHeaders};
use crate::rules::Rules;
use crate::share::fleet_epoch;
use crate::store::MemoryStore;

/// What a layer's settings are made of, besides the policy: each setting
/// of [`RateLimitLayer`](crate::RateLimitLayer) but its limiter, key,
/// cost, feedback and routes, written once here (the defaults are the
/// layer's).
#[derive(Clone, Default)]
pub(crate) struct Recipe {
    pub(crate) on_missing: OnMissingKey,
    pub(crate) headers: HeaderStyle,
    pub(crate) shadow: bool,
    pub(crate) failure: FailurePolicy,
    /// Under [`FailurePolicy::Local`]: the local limiters' state.
    pub(crate) local: Option<MemoryStore>,
    pub(crate) rejection: Option<RejectFn>,
    pub(crate) max_wait: Option<Duration>,
    pub(crate) after: Option<ResponseCost>,
    /// Refusals are gRPC statuses ([`RateLimitLayer::grpc`](crate::RateLimitLayer::grpc)).
    pub(crate) grpc: bool,
    /// The status of a refusal by a deny list entry; `None` for 403.
    pub(crate) deny_status: Option<http::StatusCode>,
}

impl Recipe {
    /// The settings deciding with `policy` on `store`, with their local
    /// fallback if the failure policy has one.
    fn settings(
        &self,
        policy: &Policy,
        limiter: &Limiter,
        metrics: &LayerMetrics,
    ) -> Arc<RateSettings> {
        let fallback = match (self.failure, &self.local) {
            (FailurePolicy::Local(share), Some(local)) => {
                let scaled = policy.scaled(share);
                let limiter = Limiter::new(scaled.clone(), local.clone());
                Some(self.make(scaled, limiter, metrics.clone(), None, true))
            }
            _ => None,
        };
        // The layer's limiter's store, and its hot keys if set.
        let limiter = limiter.bound_to(policy.clone());
        self.make(policy.clone(), limiter, metrics.clone(), fallback, false)
    }

    fn make(
        &self,
        policy: Policy,
        limiter: Limiter,
        metrics: LayerMetrics,
        fallback: Option<Arc<RateSettings>>,
        local: bool,
    ) -> Arc<RateSettings> {
        Arc::new(RateSettings {
            headers: PolicyHeaders::new(&policy, self.headers),
            policy,
            limiter,
            on_missing: self.on_missing.clone(),
            shadow: self.shadow,
            // The local limiter's memory store cannot fail; should it
            // ever, the request passes.
            failure: if local {
                FailurePolicy::Open
            } else {
                self.failure
            },
            rejection: self.rejection.clone(),
            max_wait: self.max_wait,
            metrics,
            fallback,
            local,
            after: self.after.clone(),
            grpc: self.grpc,
            deny_status: self.deny_status.unwrap_or(http::StatusCode::FORBIDDEN),
        })
    }
}

/// The settings of one (live) limiter: those of its policy, and of each
/// identity and plan with limits of their own.
pub(crate) struct LiveSettings {
    limiter: Limiter,
    recipe: Recipe,
    metrics: LayerMetrics,
    derived: ArcSwap<Derived>,
    /// Held while rebuilding, so that one request rebuilds and the others
    /// find the result.
    rebuilding: Mutex<()>,
    /// Whether the local fallback's share follows the fleet's size
    /// ([`LocalShare::auto`](crate::LocalShare::auto)).
    follows_fleet: bool,
}

struct Derived {
    /// The limiter's generation these were built for, and the fleet's
    /// size epoch if they follow it.
    generation: (u64, u64),
    base: Arc<RateSettings>,
    by_key: HashMap<Key, Arc<RateSettings>>,
    by_plan: HashMap<Arc<str>, Arc<RateSettings>>,
    lists: Lists,
}

impl LiveSettings {
    pub(crate) fn new(limiter: &Limiter, recipe: Recipe) -> Self {
        let metrics = LayerMetrics::new("rate_limit", Arc::from(limiter.name()));
        let follows_fleet = matches!(recipe.failure, FailurePolicy::Local(s) if s.is_auto());
        let generation = generation(limiter, follows_fleet);
        let rules = limiter.cell().rules();
        let derived = derive(&rules, limiter, &recipe, &metrics, generation);
        LiveSettings {
            limiter: limiter.clone(),
            recipe,
            metrics,
            derived: ArcSwap::from_pointee(derived),
            rebuilding: Mutex::new(()),
            follows_fleet,
        }
    }

    /// What the derived settings must have been built for to be current.
    #[inline]
    fn generation(&self) -> (u64, u64) {
        generation(&self.limiter, self.follows_fleet)
    }

    /// The settings deciding `key`, whose request names the plan `plan`
    /// gives (asked only when some plan has limits of its own here), and
    /// what the deny and allow lists say of it.
    #[inline]
    pub(crate) fn select<'p>(
        &self,
        key: &Key,
        plan: impl FnOnce() -> Option<&'p str>,
    ) -> (Arc<RateSettings>, Option<Verdict>) {
        let derived = self.current();
        let listed = derived.lists.check(key);
        if !derived.by_key.is_empty()
            && let Some(settings) = derived.by_key.get(key)
        {
            return (settings.clone(), listed);
        }
        if !derived.by_plan.is_empty()
            && let Some(plan) = plan()
            && let Some(settings) = derived.by_plan.get(plan)
        {
            return (settings.clone(), listed);
        }
        (derived.base.clone(), listed)
    }

    /// The settings of the policy itself (for a request without a key).
    pub(crate) fn base(&self) -> Arc<RateSettings> {
        self.current().base.clone()
    }

    /// The limiter (the live one, as the layer was given it).
    pub(crate) fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    #[inline]
    fn current(&self) -> arc_swap::Guard<Arc<Derived>> {
        let derived = self.derived.load();
        if derived.generation == self.generation() {
            return derived;
        }
        drop(derived);
        self.rebuild()
    }

    #[cold]
    fn rebuild(&self) -> arc_swap::Guard<Arc<Derived>> {
        let _one = self.rebuilding.lock().unwrap_or_else(|e| e.into_inner());
        // Read before the rules: a change made meanwhile leaves these
        // settings stale, and the next request rebuilds them again.
        let generation = self.generation();
        let derived = self.derived.load();
        if derived.generation == generation {
            return derived;
        }
        let rules = self.limiter.cell().rules();
        let derived = derive(
            &rules,
            &self.limiter,
            &self.recipe,
            &self.metrics,
            generation,
        );
        self.derived.store(Arc::new(derived));
        self.derived.load()
    }
}

/// The limiter's generation, and the fleet's size epoch if the settings
/// follow it.
#[inline]
fn generation(limiter: &Limiter, follows_fleet: bool) -> (u64, u64) {
    let epoch = if follows_fleet { fleet_epoch() } else { 0 };
    (limiter.cell().generation(), epoch)
}

/// The settings of every distinct policy of `rules`, each built once.
fn derive(
    rules: &Rules,
    limiter: &Limiter,
    recipe: &Recipe,
    metrics: &LayerMetrics,
    generation: (u64, u64),
) -> Derived {
    let mut built: HashMap<*const (), Arc<RateSettings>> = HashMap::new();
    let mut settings = |policy: &Policy| {
        built
            .entry(policy.as_ptr())
            .or_insert_with(|| recipe.settings(policy, limiter, metrics))
            .clone()
    };
    let base = settings(&rules.base);
    let by_key = rules
        .by_key
        .iter()
        .map(|(k, p)| (k.clone(), settings(p)))
        .collect();
    let by_plan = rules
        .by_plan
        .iter()
        .map(|(k, p)| (k.clone(), settings(p)))
        .collect();
    Derived {
        generation,
        base,
        by_key,
        by_plan,
        lists: rules.lists.clone(),
    }
}
