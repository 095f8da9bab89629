//! Live policies in Redis: the fleet's changes (policies, overrides,
//! plans, assignments, deny and allow lists) in hashes under one hash
//! tag, a version bumped by every change, and each instance's heartbeat.
//! Read by every instance at start and whenever the version moves.

use redis::Value;

use super::RedisStore;
use crate::error::StoreError;

/// Which table of the fleet's changes a write goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Table {
    /// Policy name → policy text.
    Policies,
    /// `{policy} {identity}` → policy text.
    Overrides,
    /// `{plan} {policy}` → policy text.
    Plans,
    /// Identity → plan name.
    Assigned,
    /// `{policy|*} k {key}` or `{policy|*} n {network}` → the entry's end
    /// in Unix ms (0: never).
    Deny,
    /// As `Deny`.
    Allow,
}

impl Table {
    const ALL: [Table; 6] = [
        Table::Policies,
        Table::Overrides,
        Table::Plans,
        Table::Assigned,
        Table::Deny,
        Table::Allow,
    ];

    fn suffix(self) -> &'static str {
        match self {
            Table::Policies => "policies",
            Table::Overrides => "overrides",
            Table::Plans => "plans",
            Table::Assigned => "assigned",
            Table::Deny => "deny",
            Table::Allow => "allow",
        }
    }
}

/// A heartbeat's answer: the store's time in Unix milliseconds, the
/// instances kept (id, `started last_seen address`), and the limits they
/// published (id, `name=limit ...`).
pub(crate) type Heartbeat = (u64, Vec<(String, String)>, Vec<(String, String)>);

/// Every table of the fleet's changes as one snapshot, and its version.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    pub(crate) version: u64,
    /// In [`Table::ALL`]'s order: each table's fields and values.
    pub(crate) tables: [Vec<(String, String)>; Table::ALL.len()],
}

impl Snapshot {
    pub(crate) fn table(&self, table: Table) -> &[(String, String)] {
        let i = Table::ALL.iter().position(|t| *t == table).unwrap_or(0);
        &self.tables[i]
    }
}

impl RedisStore {
    /// `{prefix}:{live}:<name>`: one hash tag for every live key, so that
    /// the scripts touch one slot on a cluster.
    fn live_key(&self, name: &str) -> String {
        format!("{}:{{live}}:{name}", self.prefix())
    }

    /// Every table of the fleet's changes, and their version.
    pub(crate) async fn live_load(&self) -> Result<Snapshot, StoreError> {
        let mut keys = vec![self.live_key("version")];
        keys.extend(Table::ALL.iter().map(|t| self.live_key(t.suffix())));
        let reply = self.eval(&self.inner.scripts.live_load, &keys, &[]).await?;
        let unexpected = || StoreError::UnexpectedReply(format!("live load: {reply:?}"));
        let Value::Array(items) = &reply else {
            return Err(unexpected());
        };
        let [version, tables @ ..] = items.as_slice() else {
            return Err(unexpected());
        };
        let mut snapshot = Snapshot {
            version: integer(version).ok_or_else(unexpected)?,
            ..Snapshot::default()
        };
        if tables.len() != Table::ALL.len() {
            return Err(unexpected());
        }
        for (i, table) in tables.iter().enumerate() {
            snapshot.tables[i] = pairs(table).ok_or_else(unexpected)?;
        }
        Ok(snapshot)
    }

    /// The version of the fleet's changes: one `GET`.
    pub(crate) async fn live_version(&self) -> Result<u64, StoreError> {
        let keys = [self.live_key("version")];
        let reply = self
            .eval(&self.inner.scripts.live_version, &keys, &[])
            .await?;
        integer(&reply).ok_or_else(|| StoreError::UnexpectedReply(format!("{reply:?}")))
    }

    /// Sets (or with `None` deletes) one field of one table and bumps the
    /// version; the new version. First deletes the `ended` fields (a deny
    /// or allow list's, with the value each had when read) that still
    /// hold that value.
    pub(crate) async fn live_write(
        &self,
        table: Table,
        field: &str,
        value: Option<&str>,
        ended: &[(String, String)],
    ) -> Result<u64, StoreError> {
        let keys = [self.live_key("version"), self.live_key(table.suffix())];
        let mut args = vec![field.to_owned(), value.unwrap_or("").to_owned()];
        for (field, value) in ended {
            args.extend([field.clone(), value.clone()]);
        }
        let reply = self
            .eval(&self.inner.scripts.live_write, &keys, &args)
            .await?;
        integer(&reply).ok_or_else(|| StoreError::UnexpectedReply(format!("{reply:?}")))
    }

    /// Bumps the version alone (after a reset), so that every instance
    /// reads the changes again and forgets the denials it remembers.
    pub(crate) async fn live_bump(&self) -> Result<u64, StoreError> {
        let keys = [self.live_key("version")];
        let reply = self.eval(&self.inner.scripts.live_bump, &keys, &[]).await?;
        integer(&reply).ok_or_else(|| StoreError::UnexpectedReply(format!("{reply:?}")))
    }

    /// Records this instance's heartbeat; the server's time (ms) and every
    /// instance seen within `forget_ms`, as `(id, "started last_seen
    /// address")`.
    pub(crate) async fn live_heartbeat(
        &self,
        id: &str,
        started_ms: u64,
        address: &str,
        forget_ms: u64,
        limits: &str,
    ) -> Result<Heartbeat, StoreError> {
        let keys = [self.live_key("instances"), self.live_key("limits")];
        let args = [
            id.to_owned(),
            started_ms.to_string(),
            address.to_owned(),
            forget_ms.to_string(),
            limits.to_owned(),
        ];
        let reply = self
            .eval(&self.inner.scripts.live_heartbeat, &keys, &args)
            .await?;
        let unexpected = || StoreError::UnexpectedReply(format!("heartbeat: {reply:?}"));
        match &reply {
            Value::Array(items) => match items.as_slice() {
                [now, list, limits] => Ok((
                    integer(now).ok_or_else(unexpected)?,
                    pairs(list).ok_or_else(unexpected)?,
                    pairs(limits).ok_or_else(unexpected)?,
                )),
                _ => Err(unexpected()),
            },
            _ => Err(unexpected()),
        }
    }
}

fn integer(value: &Value) -> Option<u64> {
    match value {
        Value::Int(n) => u64::try_from(*n).ok(),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        _ => None,
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// An HGETALL reply (a flat array, or a map under RESP3) as pairs.
fn pairs(value: &Value) -> Option<Vec<(String, String)>> {
    match value {
        Value::Array(items) => items
            .chunks(2)
            .map(|pair| match pair {
                [k, v] => Some((text(k)?, text(v)?)),
                _ => None,
            })
            .collect(),
        Value::Map(items) => items
            .iter()
            .map(|(k, v)| Some((text(k)?, text(v)?)))
            .collect(),
        _ => None,
    }
}
