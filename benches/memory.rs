//! `Limiter::check` on the in-process `MemoryStore`, polled synchronously:
//! the store answers with an already-resolved future, so no runtime is in
//! the measurement.
//!
//! ```sh
//! cargo bench --bench memory -- --warm-up-time 1 --measurement-time 3
//! ```

use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::sync::Barrier;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fleetgate::{Key, Limit, Limiter, MemoryStore, Policy, Rate};

/// How many distinct keys the round-robin cases cycle through.
const KEYS: usize = 10_000;

/// Decides one call by polling the store's future once: the memory store's
/// future is always ready.
fn check(limiter: &Limiter, key: &Key) -> bool {
    let mut fut = limiter.check(key, 1);
    let mut cx = Context::from_waker(Waker::noop());
    match Pin::new(&mut fut).poll(&mut cx) {
        Poll::Ready(Ok(decision)) => decision.is_allowed(),
        Poll::Ready(Err(err)) => panic!("memory store failed: {err}"),
        Poll::Pending => panic!("memory store future was not ready"),
    }
}

fn limiter(limit: Limit) -> Limiter {
    let policy = Policy::single("bench", limit).expect("valid policy");
    Limiter::new(policy, MemoryStore::new())
}

/// Admits a hot key at any speed: 1M/s (the finest rate a limit can have)
/// with a burst of 2^40, which takes days of back-to-back calls to drain.
fn hot_admit() -> Limiter {
    limiter(
        Limit::builder(Rate::per_second(1_000_000))
            .burst(1 << 40)
            .build()
            .expect("valid limit"),
    )
}

/// 1M/s burst 1M: spread over 10k keys every call is admitted.
fn spread_admit() -> Limiter {
    limiter(
        Limit::builder(Rate::per_second(1_000_000))
            .burst(1_000_000)
            .build()
            .expect("valid limit"),
    )
}

/// One per hour: after each key's first call, everything is denied.
fn deny() -> Limiter {
    limiter(Limit::new(Rate::per_hour(1)).expect("valid limit"))
}

fn keys() -> Vec<Key> {
    (0..KEYS)
        .map(|i| Key::new(format!("ip:10.0.{}.{}", i / 256, i % 256)))
        .collect()
}

/// Prints what share of `calls` round-robin calls a limiter admits after
/// one call per key, so the "admit" and "deny" cases are shown to be what
/// they say (not measured).
fn report_share(name: &str, limiter: &Limiter, keys: &[Key], calls: usize) {
    for key in keys {
        check(limiter, key);
    }
    let allowed = (0..calls)
        .filter(|i| check(limiter, &keys[i % keys.len()]))
        .count();
    println!(
        "{name}: {allowed}/{calls} admitted ({:.1}%)",
        100.0 * allowed as f64 / calls as f64
    );
}

/// Runs `iters` decisions split over two threads, each cycling through
/// `keys` from its own half, and returns the wall time from a common start
/// to the last one finishing.
fn two_threads(limiter: &Limiter, keys: &[Key], iters: u64) -> Duration {
    two_threads_with([limiter, limiter], keys, iters)
}

/// [`two_threads`], thread `t` deciding through `limiters[t]`.
fn two_threads_with(limiters: [&Limiter; 2], keys: &[Key], iters: u64) -> Duration {
    let barrier = Barrier::new(3);
    let half = iters.div_ceil(2);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|t| {
                let barrier = &barrier;
                let limiter = limiters[t];
                s.spawn(move || {
                    barrier.wait();
                    let mut i = t * keys.len() / 2;
                    for _ in 0..half {
                        black_box(check(limiter, &keys[i]));
                        i += 1;
                        if i == keys.len() {
                            i = 0;
                        }
                    }
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        for worker in workers {
            worker.join().expect("bench thread panicked");
        }
        start.elapsed()
    })
}

fn hot_key(c: &mut Criterion) {
    let hot = [Key::new("ip:192.0.2.1")];
    let admit = hot_admit();
    let denied = deny();
    report_share("hot key, admit limit", &admit, &hot, 100_000);
    report_share("hot key, deny limit", &denied, &hot, 100_000);

    let mut group = c.benchmark_group("hot_key");
    group.throughput(Throughput::Elements(1));
    group.bench_function("1_thread/admit", |b| {
        b.iter(|| check(&admit, black_box(&hot[0])));
    });
    group.bench_function("1_thread/deny", |b| {
        b.iter(|| check(&denied, black_box(&hot[0])));
    });
    group.bench_function("2_threads/admit", |b| {
        b.iter_custom(|iters| two_threads(&admit, &hot, iters));
    });
    group.bench_function("2_threads/deny", |b| {
        b.iter_custom(|iters| two_threads(&denied, &hot, iters));
    });
    group.finish();
}

fn distinct_keys(c: &mut Criterion) {
    let keys = keys();
    let admit = spread_admit();
    let denied = deny();
    report_share("10k keys, admit limit", &admit, &keys, 100_000);
    report_share("10k keys, deny limit", &denied, &keys, 100_000);

    let mut group = c.benchmark_group("keys_10k");
    group.throughput(Throughput::Elements(1));
    for (name, limiter) in [("1_thread/admit", &admit), ("1_thread/deny", &denied)] {
        group.bench_function(name, |b| {
            let mut i = 0;
            b.iter(|| {
                let allowed = check(limiter, &keys[i]);
                i += 1;
                if i == keys.len() {
                    i = 0;
                }
                allowed
            });
        });
    }
    group.bench_function("2_threads/admit", |b| {
        b.iter_custom(|iters| two_threads(&admit, &keys, iters));
    });
    // Diagnostic: the same, but each thread's limiter holds its own `Policy`
    // value (same name, same store), so the threads no longer share the
    // policy's reference counts, which every check increments.
    let store = MemoryStore::new();
    let own = || Limiter::new(spread_admit().policy().clone(), store.clone());
    let (first, second) = (own(), own());
    group.bench_function("2_threads/admit_separate_policies", |b| {
        b.iter_custom(|iters| two_threads_with([&first, &second], &keys, iters));
    });
    group.finish();
}

/// For reading the figures above: what reading the store's clock
/// (`MonotonicClock`, i.e. `tokio::time::Instant::now`) costs on its own.
fn reference(c: &mut Criterion) {
    c.bench_function("reference/tokio_instant_now", |b| {
        b.iter(tokio::time::Instant::now);
    });
}

criterion_group!(benches, hot_key, distinct_keys, reference);
criterion_main!(benches);
