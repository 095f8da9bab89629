//! A watched policy file: re-read when it changes and on SIGHUP; a file
//! that does not parse keeps the previous policies, and says why.

use std::time::Duration;

use crate::common::logs::Logs;

use fleetgate::MemoryStore;
use fleetgate::live::LivePolicies;
use fleetgate::spec::PolicyFile;

const FILE: &str = r#"
[policies]
api = "5/min"
[[routes]]
path = "/api"
policy = "api"
[plans.pro]
api = "50/min"
"#;

/// Waits (on tokio's clock, which the watcher's ticks follow) until
/// `done` holds, for at most 10 s of real time.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn parse(text: &str) -> Result<PolicyFile, toml::de::Error> {
    toml::from_str(text)
}

#[tokio::test(flavor = "current_thread")]
async fn a_changed_file_is_applied_and_a_broken_one_changes_nothing() {
    let (logs, _logging) = Logs::capture();
    let dir = std::env::temp_dir().join(format!("fleetgate-watch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("changed.toml");
    std::fs::write(&path, FILE).unwrap();

    let live = LivePolicies::new(MemoryStore::new());
    let _routes = live.routes(&parse(FILE).unwrap()).unwrap();
    live.watch_file(&path, parse).unwrap();
    assert_eq!(live.policies()["api"], "5/min");

    let seven = FILE.replace("5/min", "7/min");
    std::fs::write(&path, &seven).unwrap();
    until("the new limit", || live.policies()["api"] == "7/min").await;
    assert!(
        logs.text().contains("policy file reloaded"),
        "{}",
        logs.text()
    );

    // Broken: the limits stay, and the log says why.
    std::fs::write(&path, seven.replace("7/min", "7/mni")).unwrap();
    until("the refusal", || {
        logs.text().contains("policy file refused")
    })
    .await;
    assert!(logs.text().contains("unknown time unit"), "{}", logs.text());
    assert_eq!(live.policies()["api"], "7/min");

    // A plan naming a policy the file does not define: refused too.
    std::fs::write(
        &path,
        seven.replace("[plans.pro]\napi", "[plans.pro]\nother"),
    )
    .unwrap();
    // Waits for this refusal's own reason: one write can be seen twice (a
    // truncate, then the text), so the broken file above may already have
    // been refused twice.
    until("the second refusal", || {
        logs.text().contains("no policy named")
    })
    .await;
    assert_eq!(live.policies()["api"], "7/min");
    std::fs::remove_dir_all(&dir).ok();
}

#[cfg(unix)]
#[tokio::test(flavor = "current_thread")]
async fn sighup_rereads_the_file_even_when_its_text_is_the_same() {
    let (logs, _logging) = Logs::capture();
    let dir = std::env::temp_dir().join(format!("fleetgate-hup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("hup.toml");
    std::fs::write(&path, FILE).unwrap();

    let live = LivePolicies::new(MemoryStore::new());
    let _routes = live.routes(&parse(FILE).unwrap()).unwrap();
    live.watch_file(&path, parse).unwrap();
    // The file is as the service started with it: nothing to apply until
    // the signal asks.
    nix::sys::signal::raise(nix::sys::signal::Signal::SIGHUP).unwrap();
    until("the reload on SIGHUP", || {
        logs.text().contains("policy file reloaded")
    })
    .await;
    assert_eq!(live.policies()["api"], "5/min");
    std::fs::remove_dir_all(&dir).ok();
}
