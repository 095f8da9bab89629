//! Every Lua script the Redis store runs, in one registry.
//!
//! A script is `lua/prelude.lua`, one file of `lua/` (an algorithm's,
//! `budget.lua`, `lease.lua`, `live.lua` or `reset.lua`) and one line that calls an
//! operation of that file, such as `return charge(KEYS, ARGV,
//! clock(ARGV[1]))`, less the definitions that line does not reach
//! ([`prune`]). Each file says what its operations take (KEYS, ARGV) and
//! answer, and needs nothing but the prelude before it.
//!
//! Each script is made and hashed once per process; each store counts,
//! per script, its own loads and metrics (the name is their `op` label).

use std::sync::LazyLock;

use super::LuaScript;
use super::prune::prune;
use crate::algorithm::Algorithm;

/// The script `name` that calls `call` in `lua/<file>`, made and hashed
/// once per process, the first time a store is made.
macro_rules! script {
    ($name:expr, $file:literal, $call:expr) => {{
        static SCRIPT: LazyLock<(String, String)> = LazyLock::new(|| {
            let source = concat!(
                include_str!("../../../lua/prelude.lua"),
                include_str!(concat!("../../../lua/", $file)),
            );
            let script = prune(source, AsRef::<str>::as_ref(&$call));
            let sha = redis::Script::new(&script).get_hash().to_owned();
            (script, sha)
        });
        LuaScript::new($name, SCRIPT.0.as_str(), SCRIPT.1.as_str())
    }};
}

/// The scripts of the algorithm in `lua/<file>`, one per operation, each
/// reading the clock: the check named `name`, the others
/// `<name>_<operation>`. `call` makes each operation's call from its name:
/// [`own`] or [`windowed`].
macro_rules! operations {
    ($name:literal, $file:literal, $call:expr) => {
        Operations {
            check: script!($name, $file, $call("check")),
            peek: script!(concat!($name, "_peek"), $file, $call("peek")),
            charge: script!(concat!($name, "_charge"), $file, $call("charge")),
            refund: script!(concat!($name, "_refund"), $file, $call("refund")),
        }
    };
}

/// The call of the operation `op` of the algorithm's own file.
fn own(op: &str) -> String {
    format!("{op}(KEYS, ARGV, clock(ARGV[1]))")
}

/// The call of the prelude's window operation `op` on the table of a
/// window algorithm's parts, `parts` (see lua/prelude.lua).
fn windowed(parts: &str) -> impl Fn(&str) -> String + '_ {
    move |op| format!("window_{op}({parts}, KEYS, ARGV, clock(ARGV[1]))")
}

/// Every script the store runs.
#[derive(Debug)]
pub(crate) struct Scripts {
    gcra: Operations,
    sliding_log: Operations,
    sliding_window: Operations,
    calendar: Operations,
    fixed_window: Operations,
    pub(super) gcra_defer: LuaScript,
    pub(super) reset: LuaScript,
    pub(super) budget: LuaScript,
    pub(super) lease_acquire: LuaScript,
    pub(super) lease_renew: LuaScript,
    pub(super) lease_release: LuaScript,
    /// Acquires and releases queued together (see [`batch`](super::batch)).
    pub(super) leases: LuaScript,
    pub(super) live_load: LuaScript,
    pub(super) live_version: LuaScript,
    pub(super) live_write: LuaScript,
    pub(super) live_bump: LuaScript,
    pub(super) live_heartbeat: LuaScript,
}

/// An algorithm's scripts, one per operation.
#[derive(Debug)]
pub(super) struct Operations {
    /// One or more calls decided in order (see [`batch`](super::batch)).
    pub(super) check: LuaScript,
    pub(super) peek: LuaScript,
    pub(super) charge: LuaScript,
    pub(super) refund: LuaScript,
}

impl Scripts {
    /// Every script, with load counts and metrics of this store's own.
    pub(super) fn new() -> Self {
        Scripts {
            gcra: operations!("gcra", "gcra.lua", own),
            // The sliding log refunds with a function of its own.
            sliding_log: operations!("sliding_log", "sliding_log.lua", |op| match op {
                "refund" => own(op),
                _ => windowed("sliding_log")(op),
            }),
            sliding_window: operations!(
                "sliding_counter",
                "sliding_window.lua",
                windowed("sliding_window")
            ),
            calendar: operations!("calendar", "calendar.lua", windowed("calendar")),
            fixed_window: operations!("fixed_window", "fixed_window.lua", windowed("fixed_window")),
            gcra_defer: script!("gcra_defer", "gcra.lua", own("defer")),
            reset: script!("reset", "reset.lua", "reset(KEYS, ARGV)"),
            budget: script!("budget", "budget.lua", own("take")),
            lease_acquire: script!("lease_acquire", "lease.lua", own("acquire")),
            lease_renew: script!("lease_renew", "lease.lua", own("renew")),
            lease_release: script!("lease_release", "lease.lua", "release(KEYS, ARGV)"),
            leases: script!("leases", "lease.lua", own("batch")),
            live_load: script!("live_load", "live.lua", "load(KEYS, ARGV)"),
            live_version: script!("live_version", "live.lua", "version(KEYS, ARGV)"),
            live_write: script!("live_write", "live.lua", "write(KEYS, ARGV)"),
            live_bump: script!("live_bump", "live.lua", "bump(KEYS, ARGV)"),
            live_heartbeat: script!("live_heartbeat", "live.lua", "heartbeat(KEYS, ARGV)"),
        }
    }

    /// The scripts of `algorithm`'s operations.
    pub(super) fn of(&self, algorithm: Algorithm) -> &Operations {
        match algorithm {
            Algorithm::Gcra => &self.gcra,
            Algorithm::SlidingLog => &self.sliding_log,
            Algorithm::SlidingWindow => &self.sliding_window,
            Algorithm::FixedWindow => &self.fixed_window,
            Algorithm::Calendar => &self.calendar,
        }
    }

    /// Every script, for the tests.
    #[cfg(test)]
    fn all(&self) -> Vec<&LuaScript> {
        let mut all: Vec<&LuaScript> = [
            &self.gcra,
            &self.sliding_log,
            &self.sliding_window,
            &self.calendar,
            &self.fixed_window,
        ]
        .into_iter()
        .flat_map(|ops| [&ops.check, &ops.peek, &ops.charge, &ops.refund])
        .collect();
        all.extend([
            &self.gcra_defer,
            &self.reset,
            &self.budget,
            &self.lease_acquire,
            &self.lease_renew,
            &self.lease_release,
            &self.leases,
            &self.live_load,
            &self.live_version,
            &self.live_write,
            &self.live_bump,
            &self.live_heartbeat,
        ]);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_is_its_own() {
        let scripts = Scripts::new();
        let mut shas: Vec<&str> = scripts.all().iter().map(|s| s.sha).collect();
        shas.sort_unstable();
        shas.dedup();
        assert_eq!(shas.len(), 32);
        let mut names: Vec<&str> = scripts.all().iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 32);
    }

    /// The functions a script defines, in order.
    fn functions(script: &LuaScript) -> Vec<&str> {
        let defined = script.source.lines();
        let defined = defined.filter_map(|line| line.strip_prefix("local function "));
        defined.filter_map(|f| f.split('(').next()).collect()
    }

    #[test]
    fn a_script_defines_what_its_call_reaches() {
        let scripts = Scripts::new();
        assert_eq!(
            functions(&scripts.lease_release),
            ["clock", "give_back", "bury", "undo", "release"]
        );
        assert_eq!(
            functions(&scripts.leases),
            ["clock", "take", "give_back", "bury", "undo", "batch"]
        );
        assert_eq!(
            functions(&scripts.gcra.check),
            [
                "clock",
                "idiv",
                "put",
                "blocked",
                "block",
                "tat_until",
                "tat_kept",
                "decide_all",
                "check"
            ]
        );
        assert_eq!(
            functions(&scripts.fixed_window.refund),
            [
                "clock",
                "idiv",
                "counted",
                "held_to_reset",
                "put",
                "window_refund",
                "lists",
                "read",
                "verdicts",
                "store"
            ]
        );
        for script in scripts.all() {
            let last = script.source.lines().last().unwrap_or_default();
            assert!(last.starts_with("return "), "{}: {last}", script.name);
        }
    }
}
