//! What one limiter decides with right now: its policy, the identities
//! with limits of their own, the plans a request may name, and its deny
//! and allow lists. Swapped whole when anything changes, read without a
//! lock on every decision.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

use crate::key::Key;
use crate::lists::Lists;
use crate::policy::Policy;

/// The plan a request was sold, put in its extensions by the
/// application's authentication layer (from a token's claim, say). A
/// [`RateLimitLayer`](crate::RateLimitLayer) on a limiter of
/// [`LivePolicies`](crate::live::LivePolicies) then decides the request with that plan's limits,
/// unless its identity has limits of its own.
///
/// ```
/// use fleetgate::live::Plan;
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(Plan::new("pro"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Plan(Arc<str>);

impl Plan {
    /// The plan named `name`.
    pub fn new(name: &str) -> Self {
        Plan(Arc::from(name))
    }

    /// The plan's name.
    pub fn name(&self) -> &str {
        &self.0
    }
}

/// One limiter's rules, as one value: a decision reads them once.
#[derive(Debug)]
pub(crate) struct Rules {
    /// The policy of every identity without limits of its own.
    pub(crate) base: Policy,
    /// Identities with limits of their own: an override, or the policy of
    /// the plan they were assigned. Plans' policies are shared values.
    pub(crate) by_key: HashMap<Key, Policy>,
    /// The policy of each plan that defines one for this limiter, for
    /// requests that name their plan ([`Plan`](crate::live::Plan)).
    pub(crate) by_plan: HashMap<Arc<str>, Policy>,
    /// The deny and allow entries in force for this limiter.
    pub(crate) lists: Lists,
}

impl Rules {
    pub(crate) fn new(base: Policy) -> Self {
        Rules {
            base,
            by_key: HashMap::new(),
            by_plan: HashMap::new(),
            lists: Lists::default(),
        }
    }

    /// The policy deciding `key`: its own limits (override or assigned
    /// plan) first, then the plan the request names, then the base.
    #[inline]
    pub(crate) fn resolve(&self, key: &Key, plan: Option<&str>) -> &Policy {
        if !self.by_key.is_empty()
            && let Some(policy) = self.by_key.get(key)
        {
            return policy;
        }
        if let Some(plan) = plan
            && let Some(policy) = self.by_plan.get(plan)
        {
            return policy;
        }
        &self.base
    }
}

/// A limiter's rules and a count of their changes, shared by every clone
/// of the limiter and by the layers built on it.
#[derive(Debug)]
pub(crate) struct Cell {
    name: Arc<str>,
    rules: ArcSwap<Rules>,
    /// Bumped after every swap: layers rebuild what they derive from the
    /// rules when it moves.
    generation: AtomicU64,
}

impl Cell {
    pub(crate) fn new(policy: Policy) -> Self {
        Cell {
            name: policy.name_arc(),
            rules: ArcSwap::from_pointee(Rules::new(policy)),
            generation: AtomicU64::new(0),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    #[inline]
    pub(crate) fn rules(&self) -> arc_swap::Guard<Arc<Rules>> {
        self.rules.load()
    }

    pub(crate) fn set(&self, rules: Rules) {
        self.rules.store(Arc::new(rules));
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}
