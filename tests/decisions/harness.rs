//! The harness of the conformance suites.

/// One `check` of the conformance suites, through both of `Limiter`'s
/// APIs: on the memory store (`store` is `"memory"`) every other call
/// (counted by `checks`) is decided with `check_now` (at once, no future),
/// the rest with `check`, so that every scenario's exact decisions hold
/// for both. On Redis, `check_now` must answer only a cost no limit could
/// admit, and then as `check` does.
pub async fn check_both_ways(
    store: &str,
    checks: &std::sync::atomic::AtomicUsize,
    limiter: &fleetgate::Limiter,
    key: &str,
    cost: u64,
) -> fleetgate::Decision {
    let key = fleetgate::Key::new(key);
    let at_once = checks.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 2 == 1;
    if store == "memory" && at_once {
        return limiter
            .check_now(&key, cost)
            .expect("the memory store decides at once");
    }
    let now = (store == "redis").then(|| limiter.check_now(&key, cost));
    let decision = limiter
        .check(&key, cost)
        .await
        .unwrap_or_else(|err| panic!("{store}: store error: {err}"));
    if let Some(now) = now {
        let impossible = cost > limiter.policy().max_cost();
        assert_eq!(now, impossible.then(|| decision.clone()));
    }
    decision
}
