//! Redis' own command counters (`INFO commandstats`), to count what a
//! store really sent.
#![allow(dead_code)]

use std::collections::HashMap;

use redis::aio::ConnectionLike;

/// `INFO commandstats` as command name → calls.
pub async fn command_calls<C: ConnectionLike>(conn: &mut C) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    parse_command_calls(&info)
}

/// `cmdstat_evalsha:calls=12,usec=...` lines into name → calls, leaving
/// out the counters' own reset (`CONFIG RESETSTAT`).
pub fn parse_command_calls(info: &str) -> HashMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.trim().parse().ok()?))
        })
        .filter(|(name, _)| name != "config|resetstat")
        .collect()
}

/// Scripts the store sent: `EVALSHA` plus `EVAL` fallbacks.
pub async fn script_calls<C: ConnectionLike>(conn: &mut C) -> u64 {
    scripts_in(&command_calls(conn).await)
}

/// The scripts (`EVALSHA` plus `EVAL`) among command counts.
pub fn scripts_in(calls: &HashMap<String, u64>) -> u64 {
    calls.get("evalsha").copied().unwrap_or(0) + calls.get("eval").copied().unwrap_or(0)
}

/// `CONFIG RESETSTAT`.
pub async fn reset_stats<C: ConnectionLike>(conn: &mut C) {
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .expect("CONFIG RESETSTAT");
}
