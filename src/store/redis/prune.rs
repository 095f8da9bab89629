//! A script keeps only the top-level definitions its call reaches.
//!
//! Redis' Lua runs a script's whole text on every call, so each `local
//! function` at its top level makes a closure every time, used or not,
//! and that costs Redis CPU on every call. A script is
//! the prelude and one file of `lua/` (see `scripts.rs`), which between
//! them define everything that file's operations need; one call reaches
//! a part of it. [`prune`] drops the rest.
//!
//! It relies on the shape every file of `lua/` has: at the top level only
//! `local function name(...)`, `local name = ...` and `local a, b = ...`
//! definitions, each starting at the first column, their bodies indented
//! but for a closing `end`, and comments. A definition is kept if the call
//! or a kept definition names it (any word equal to its name outside a
//! comment, so a name in a string keeps it too: when in doubt, kept); the
//! comment lines right above it go with it. Also included by the benches,
//! whose plain `EVALSHA` loop runs the same GCRA script the store does.

use std::collections::HashSet;

/// `source` with only the top-level definitions that `call` reaches, in
/// their order, followed by `return <call>`.
///
/// Panics on a top-level line of another shape: the sources are the
/// crate's own files, and every script is built by the unit tests.
pub(crate) fn prune(source: &str, call: &str) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let items = definitions(&lines);
    let mut needed: HashSet<&str> = words(call).collect();
    let mut keep = vec![false; items.len()];
    // Later definitions may only name earlier ones, so one pass from the
    // end finds everything reached.
    for (k, item) in items.iter().enumerate().rev() {
        if item.names.iter().any(|name| needed.contains(name)) {
            keep[k] = true;
            for line in &lines[item.code..item.end] {
                needed.extend(words(line));
            }
        }
    }
    let mut out = String::with_capacity(source.len());
    for (item, _) in items.iter().zip(&keep).filter(|(_, keep)| **keep) {
        for line in &lines[item.start..item.end] {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str("return ");
    out.push_str(call);
    out.push('\n');
    out
}

/// One top-level definition: lines `start..end`, the first `code - start`
/// of them its comment.
struct Definition<'a> {
    start: usize,
    code: usize,
    end: usize,
    names: Vec<&'a str>,
}

fn definitions<'a>(lines: &[&'a str]) -> Vec<Definition<'a>> {
    let mut items: Vec<Definition<'a>> = Vec::new();
    let mut open = false;
    for (i, line) in lines.iter().enumerate() {
        if let Some(rest) = line.strip_prefix("local ") {
            let mut start = i;
            while start > 0 && lines[start - 1].starts_with("--") {
                start -= 1;
            }
            items.push(Definition {
                start,
                code: i,
                end: i + 1,
                names: defined(rest),
            });
            open = true;
        } else if line.starts_with("--") {
            // A comment at the first column ends the definition above it.
            open = false;
        } else if line.is_empty() || line.starts_with(' ') || *line == "end" {
            if let Some(item) = items.last_mut().filter(|_| open) {
                item.end = i + 1;
            }
        } else {
            panic!("lua/: a top-level line that is not a definition: {line:?}");
        }
    }
    items
}

/// The names a `local` line (without `local `) defines.
fn defined(rest: &str) -> Vec<&str> {
    if let Some(function) = rest.strip_prefix("function ") {
        return function
            .split('(')
            .next()
            .map(str::trim)
            .into_iter()
            .collect();
    }
    let names = rest.split('=').next().unwrap_or_default();
    names.split(',').map(str::trim).collect()
}

/// The words of a line of Lua outside its comment.
fn words(line: &str) -> impl Iterator<Item = &str> {
    let code = line.split("--").next().unwrap_or_default();
    code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| !word.is_empty())
}

#[cfg(test)]
mod tests {
    const SOURCE: &str = "\
-- The file's comment, of no definition.

-- a's comment.
local function a(x)
  return x

end

local b = 2
-- c uses a and b.
local function c()
  return a(b)
end
local d, e = 1, 2
";

    #[test]
    fn keeps_what_the_call_reaches_with_its_comments() {
        assert_eq!(
            super::prune(SOURCE, "c()"),
            "-- a's comment.\nlocal function a(x)\n  return x\n\nend\n\n\
             local b = 2\n-- c uses a and b.\nlocal function c()\n  return a(b)\nend\n\
             return c()\n"
        );
        assert_eq!(
            super::prune(SOURCE, "e + 1"),
            "local d, e = 1, 2\nreturn e + 1\n"
        );
        assert_eq!(
            super::prune(SOURCE, "b -- a"),
            "local b = 2\nreturn b -- a\n"
        );
    }

    #[test]
    #[should_panic(expected = "not a definition")]
    fn refuses_a_top_level_statement() {
        super::prune("local a = 1\nredis.call('DEL', 'x')\n", "a");
    }
}
