//! Policy files re-read while the service runs: when their text changes,
//! and on Unix when the process gets `SIGHUP`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Weak;
use std::task::{Context, Poll};
use std::time::Duration;

use super::{Fleet, LIVE_WARNINGS, LivePolicies};
use crate::error::ConfigError;
use crate::policy::spec::PolicyFile;

/// How often a watched file is read to see whether it changed: a policy
/// file is small, and reading it is the one check that never misses a
/// change (a modification time can stay the same within its resolution).
const WATCH_EVERY: Duration = Duration::from_millis(500);

impl LivePolicies {
    /// Re-reads the policy file at `path` whenever its text changes
    /// (checked every 500 ms) and, on Unix, when the process gets
    /// `SIGHUP`, and applies it with [`reload`](Self::reload): changed
    /// limits and plans apply within about a second. A file that cannot be
    /// read, does not parse (`parse` says why: `toml::from_str`, say) or is
    /// refused keeps the previous policies, and the reason is logged at
    /// `warn`. Stops when every clone of these live policies is dropped.
    /// Call it within a tokio runtime.
    ///
    /// ```no_run
    /// # fn demo(live: fleetgate::live::LivePolicies) -> Result<(), fleetgate::ConfigError> {
    /// use fleetgate::spec::PolicyFile;
    ///
    /// live.watch_file("policies.toml", |text| toml::from_str::<PolicyFile>(text))?;
    /// # Ok(()) }
    /// ```
    pub fn watch_file<F, E>(&self, path: impl Into<PathBuf>, parse: F) -> Result<(), ConfigError>
    where
        F: Fn(&str) -> Result<PolicyFile, E> + Send + 'static,
        E: fmt::Display + 'static,
    {
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| ConfigError::NoRuntime {
                what: "LivePolicies::watch_file",
            })?;
        let path = path.into();
        // What the service started with, if it can be read: a first
        // check finding the same text applies nothing.
        let seen = std::fs::read_to_string(&path).ok();
        // Installed before returning, so that a SIGHUP sent from then on
        // is never the default one that ends the process.
        let hangups = Hangups::new();
        let fleet = std::sync::Arc::downgrade(&self.fleet);
        runtime.spawn(watch(fleet, path, parse, seen, hangups));
        Ok(())
    }
}

async fn watch<F, E>(
    fleet: Weak<Fleet>,
    path: PathBuf,
    parse: F,
    mut seen: Option<String>,
    mut hangups: Hangups,
) where
    F: Fn(&str) -> Result<PolicyFile, E>,
    E: fmt::Display,
{
    let mut ticks = tokio::time::interval(WATCH_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // A SIGHUP, or else the next tick (`tokio::select!` would need
        // tokio's macros, which the memory-only build has no other use for).
        let forced = std::future::poll_fn(|cx| match hangups.poll(cx) {
            Poll::Ready(()) => Poll::Ready(true),
            Poll::Pending => ticks.poll_tick(cx).map(|_| false),
        })
        .await;
        let Some(fleet) = fleet.upgrade() else { return };
        // A policy file is small: read in place, as a config crate would.
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(err) => {
                if forced || LIVE_WARNINGS.allow() {
                    tracing::warn!(path = %path.display(), error = %err, "policy file unreadable; kept the previous policies");
                }
                continue;
            }
        };
        if !forced && seen.as_deref() == Some(text.as_str()) {
            continue;
        }
        apply(&LivePolicies { fleet }, &path, &text, &parse);
        // A refused text is not retried until it changes again (or a
        // SIGHUP asks): its warning is logged once.
        seen = Some(text);
    }
}

fn apply<F, E>(live: &LivePolicies, path: &Path, text: &str, parse: &F)
where
    F: Fn(&str) -> Result<PolicyFile, E>,
    E: fmt::Display,
{
    let result = match parse(text) {
        Ok(file) => live.reload(&file).map_err(|err| err.to_string()),
        Err(err) => Err(err.to_string()),
    };
    match result {
        Ok(()) => tracing::info!(path = %path.display(), "policy file reloaded"),
        Err(error) => tracing::warn!(
            path = %path.display(),
            error,
            "policy file refused; kept the previous policies"
        ),
    }
}

/// `SIGHUP`s, on Unix; elsewhere (or if the handler cannot be installed)
/// none ever comes.
struct Hangups {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Hangups {
    fn new() -> Self {
        Hangups {
            #[cfg(unix)]
            signal: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok(),
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        #[cfg(unix)]
        if let Some(signal) = &mut self.signal {
            match signal.poll_recv(cx) {
                Poll::Ready(Some(())) => return Poll::Ready(()),
                // The handler is gone: no SIGHUP will come.
                Poll::Ready(None) => self.signal = None,
                Poll::Pending => {}
            }
        }
        let _ = cx;
        Poll::Pending
    }
}
