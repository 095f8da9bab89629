//! The reusable lease pieces with a lease of the test's own: released once
//! on drop, renewed on time by its own task or a shared renewer, and
//! renewal stops with the guard.
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use fleetgate::lease::{GuardedBody, Lease, LeaseGuard, Renewer};
use fleetgate::store::StoreFuture;
use http_body_util::{BodyExt, Full};

/// Counts what the guard does with it.
#[derive(Clone, Default)]
struct Probe {
    renewals: Arc<AtomicUsize>,
    releases: Arc<AtomicUsize>,
}

impl Probe {
    fn renewals(&self) -> usize {
        self.renewals.load(Ordering::SeqCst)
    }

    fn releases(&self) -> usize {
        self.releases.load(Ordering::SeqCst)
    }
}

impl Lease for Probe {
    fn release(&self) -> StoreFuture<bool> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        StoreFuture::ready(Ok(true))
    }

    fn renew(&self) -> StoreFuture<bool> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        StoreFuture::ready(Ok(true))
    }
}

const MS: Duration = Duration::from_millis(1);

#[tokio::test(start_paused = true)]
async fn a_guard_renews_on_its_own_task_until_dropped() {
    let probe = Probe::default();
    let guard = LeaseGuard::new(probe.clone()).renew_every(300 * MS);
    tokio::time::sleep(1000 * MS).await;
    assert_eq!(probe.renewals(), 3);
    assert_eq!(probe.releases(), 0);
    drop(guard);
    assert_eq!(probe.releases(), 1);
    tokio::time::sleep(1000 * MS).await;
    assert_eq!(probe.renewals(), 3, "renewed after the guard was dropped");
    assert_eq!(probe.releases(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_shared_renewer_renews_each_lease_within_its_interval() {
    let renewer = Renewer::new(400 * MS);
    let a = Probe::default();
    let b = Probe::default();
    let guard_a = LeaseGuard::new(a.clone()).renewed_by(&renewer);
    tokio::time::sleep(50 * MS).await;
    let guard_b = LeaseGuard::new(b.clone()).renewed_by(&renewer);
    assert_eq!(renewer.len(), 2);
    // Each lease is renewed every 300 to 400 ms: 2 or 3 times in 1 s.
    tokio::time::sleep(1000 * MS).await;
    for probe in [&a, &b] {
        assert!((2..=3).contains(&probe.renewals()), "{}", probe.renewals());
    }
    drop(guard_a);
    assert_eq!(renewer.len(), 1);
    let a_renewals = a.renewals();
    tokio::time::sleep(1000 * MS).await;
    assert_eq!(a.renewals(), a_renewals, "renewed after its guard dropped");
    assert!(b.renewals() >= 4);
    drop(guard_b);
    assert!(renewer.is_empty());
    assert_eq!((a.releases(), b.releases()), (1, 1));

    // The task stopped with the last lease; a new lease starts it again.
    let c = Probe::default();
    let _guard_c = LeaseGuard::new(c.clone()).renewed_by(&renewer);
    tokio::time::sleep(1000 * MS).await;
    assert!(c.renewals() >= 2);
}

#[tokio::test]
async fn a_guarded_body_releases_at_its_end_not_before() {
    let probe = Probe::default();
    let guard = LeaseGuard::new(probe.clone());
    let body = GuardedBody::new(Full::new(Bytes::from_static(b"hello")), Some(guard));
    assert!(body.holds_lease());
    assert_eq!(probe.releases(), 0);
    let bytes = body.collect().await.unwrap().to_bytes();
    assert_eq!(&bytes[..], b"hello");
    assert_eq!(probe.releases(), 1);
}

#[test]
fn without_a_runtime_a_guard_still_releases_a_ready_lease() {
    let probe = Probe::default();
    // No runtime: nothing to renew on, but a release that is done at once
    // (like the memory store's) still happens.
    let guard = LeaseGuard::new(probe.clone())
        .renew_every(MS)
        .renewed_by(&Renewer::new(MS));
    drop(guard);
    assert_eq!((probe.renewals(), probe.releases()), (0, 1));
}
