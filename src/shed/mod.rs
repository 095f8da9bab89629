//! Load shedding: under overload, drop the least important traffic first so
//! that critical traffic keeps working.
//!
//! Requests are put into priority [`Tiers`] by a classifier
//! ([`RouteTiers`], [`HeaderTier`] or any closure); unclassified requests
//! fall into the set's default tier (`normal` in the default set). The most
//! important tier is never shed.

// The shedding layers build on these parts.
#![allow(dead_code)]

mod tier;
mod utilization;

pub use self::tier::{Classify, HeaderTier, MAX_TIERS, RouteTiers, Tier, Tiers};
pub use self::utilization::{Random, ThreadRandom, UtilizationConfig};
