//! Helpers shared by the benches that `scripts/bench.sh` runs: settings
//! from the environment, percentiles, CPU pinning, Redis' own counters and
//! the target rows every bench prints.
#![allow(dead_code)]

use std::time::Duration;

use redis::aio::MultiplexedConnection;

#[path = "../../src/store/redis/prune.rs"]
mod prune;

/// The store's GCRA check script, made as src/store/redis/scripts.rs
/// makes it: the prelude and the algorithm's file, kept to what the line
/// that calls the check reaches.
pub fn gcra_check_lua() -> String {
    let source = concat!(
        include_str!("../../lua/prelude.lua"),
        include_str!("../../lua/gcra.lua")
    );
    prune::prune(source, "check(KEYS, ARGV, clock(ARGV[1]))")
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Whether cargo runs the bench for measurement (`cargo bench`) rather than
/// as a smoke test (`cargo test --all-targets`, which passes no `--bench`).
pub fn measuring() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// A positive number of seconds from the environment variable `name`, or
/// `default`.
pub fn secs(name: &str, default: f64) -> Duration {
    let secs = std::env::var(name)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(default);
    Duration::from_secs_f64(secs)
}

/// A positive count from the environment variable `name`, or `default`.
pub fn count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

/// The value at quantile `p` of `sorted` (nearest rank).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Microseconds, for tables.
pub fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Pins the calling thread (and what it spawns later: threads, child
/// processes) to `cpu`, if the machine has it; a no-op where affinity
/// cannot be set.
pub fn pin(cpu: usize) {
    // No check against `available_parallelism`, which counts the CPUs of
    // the caller's current mask: once pinned to one CPU it says 1, and a
    // later pin elsewhere silently did nothing (the decisions bench's
    // peers and their servers all ran on CPU 0). A CPU the machine lacks
    // makes `sched_setaffinity` fail, which leaves the mask as it was.
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

/// CPU time (user + system) this process's threads named `name` (a
/// thread and a multi-thread runtime's worker it starts) have used so far,
/// summed (Linux `/proc`; `None` elsewhere, or with no such thread).
pub fn thread_cpu_time(name: &str) -> Option<Duration> {
    let mut total = None;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        // A thread that ended meanwhile has no files left.
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if comm.trim() == name
            && let Some(used) = stat_cpu_time(&dir.join("stat"), 11)
        {
            *total.get_or_insert(Duration::ZERO) += used;
        }
    }
    total
}

/// CPU time (user + system) the calling thread has used so far (Linux
/// `/proc`; `None` elsewhere).
pub fn own_thread_cpu_time() -> Option<Duration> {
    stat_cpu_time(std::path::Path::new("/proc/thread-self/stat"), 11)
}

/// CPU time of this process's children that have ended and been waited
/// for: a child's whole process, all its threads.
pub fn children_cpu_time() -> Option<Duration> {
    stat_cpu_time(std::path::Path::new("/proc/self/stat"), 13)
}

/// CPU time of a thread group's leader so far (`/proc/<pid>/schedstat`, in
/// ns; `pid` may be `self`): the client's runtime thread is a bench's main
/// thread, and redis-server runs every command on its main thread.
pub fn leader_cpu(pid: &str) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
    Some(Duration::from_nanos(
        text.split_whitespace().next()?.parse().ok()?,
    ))
}

/// `after - before`, when both were read.
pub fn cpu_delta(before: Option<Duration>, after: Option<Duration>) -> Option<Duration> {
    Some(after?.saturating_sub(before?))
}

/// Two consecutive time fields of a `/proc/.../stat` file, the first at
/// `first` counting from field 3 (11: the task's user and system time;
/// 13: its waited-for children's), in the kernel's USER_HZ ticks (100 per
/// second on Linux).
fn stat_cpu_time(path: &std::path::Path, first: usize) -> Option<Duration> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The fields after the parenthesised name, from field 3 on.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks =
        fields.get(first)?.parse::<u64>().ok()? + fields.get(first + 1)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// One `field:value` line of an `INFO` reply.
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

/// Empties the server.
pub async fn flush_all(admin: &mut MultiplexedConnection) -> Result<(), BoxError> {
    redis::cmd("FLUSHALL")
        .arg("SYNC")
        .query_async::<()>(admin)
        .await?;
    Ok(())
}

/// The server's version, from `INFO server`.
pub async fn redis_version(admin: &mut MultiplexedConnection) -> Result<String, BoxError> {
    let info: String = redis::cmd("INFO").arg("server").query_async(admin).await?;
    Ok(info_field(&info, "redis_version").unwrap_or("?").to_owned())
}

/// A target row, `| target | required | measured | PASS/MISS |`, the form
/// `scripts/bench.sh` collects into its summary.
pub fn target_row(name: &str, required: &str, measured: &str, pass: bool) -> String {
    format!(
        "| {name} | {required} | {measured} | {} |",
        if pass { "PASS" } else { "MISS" }
    )
}

/// The heading and header of a table of [`target_row`]s.
pub fn targets_heading() -> String {
    let what = if measuring() {
        "Targets (ratios from this run)"
    } else {
        "Targets (a smoke run without `--bench`: these figures measure nothing)"
    };
    format!("\n{what}:\n\n| target | required | measured | result |\n|---|---|---:|---|")
}
