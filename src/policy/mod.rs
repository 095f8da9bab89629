//! Limits, rates and policies, and the policy text and files they are
//! read from: what a limiter decides with, checked when it is built.

mod limit;
mod rate;
pub mod spec;

pub use self::limit::*;
pub use self::rate::Rate;
