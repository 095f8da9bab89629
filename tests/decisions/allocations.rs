//! What the request path allocates, counted by a global allocator: making a
//! short key (any IPv4 address) allocates nothing, and a memory-store
//! decision on a known identity, admitted or denied, allocates nothing.
//! The counter (allocation-counter's global allocator, in this test binary
//! only) counts per thread.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use fleetgate::{Key, Limit, Limiter, MemoryStore, Policy, Rate};

/// How many allocations `f` made on this thread, and its result.
fn allocations<T>(f: impl FnOnce() -> T) -> (u64, T) {
    let mut out = None;
    let info = allocation_counter::measure(|| out = Some(f()));
    (info.count_total, out.expect("measured closure ran"))
}

#[test]
fn short_keys_and_memory_decisions_allocate_nothing() {
    // Keys of up to 23 bytes are kept inline.
    for ip in [
        IpAddr::V4(Ipv4Addr::new(255, 255, 255, 255)),
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
        IpAddr::V6("2001:db8::7".parse().unwrap()),
    ] {
        let (n, key) = allocations(|| Key::from_ip(ip));
        assert_eq!(n, 0, "{ip}: {}", key);
        let (n, copy) = allocations(|| key.clone());
        assert_eq!((n, &copy), (0, &key));
    }
    let (n, _) = allocations(|| Key::new("tenant:4711"));
    assert_eq!(n, 0);
    // Longer ones allocate once, and their clones share it.
    let (n, long) = allocations(|| Key::new("tenant:a-rather-long-identity"));
    assert_eq!(n, 1);
    assert_eq!(allocations(|| long.clone()).0, 0);

    // A known identity is decided in place: no allocation, admitted or
    // denied, on one limit or several.
    let store = MemoryStore::new();
    let one = Limiter::new(
        Policy::single(
            "one",
            Limit::builder(Rate::per_hour(3)).burst(3).build().unwrap(),
        )
        .unwrap(),
        store.clone(),
    );
    let two = Limiter::new(
        Policy::builder("two")
            .limit(Limit::builder(Rate::per_hour(3)).burst(3).build().unwrap())
            .limit(
                Limit::builder(Rate::per_second(100))
                    .burst(5)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap(),
        store,
    );
    let key = Key::from_ip(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)));
    for limiter in [&one, &two] {
        // The first call makes the identity's slot.
        let mut first = limiter.check(&key, 1);
        assert!(first.take_ready().unwrap().unwrap().is_allowed());
        let mut admitted = 0;
        for i in 0..5 {
            let (n, allowed) = allocations(|| {
                let mut decision = limiter.check(&key, 1);
                decision.take_ready().unwrap().unwrap().is_allowed()
            });
            assert_eq!(n, 0, "call {i}");
            admitted += u32::from(allowed);
        }
        assert_eq!(admitted, 2, "the burst of 3 holds");
    }
}
