//! A key's text, written on the stack for an IP key.

use std::fmt;

/// A key's text, from [`Key::text`]: borrowed from the key, or written on
/// the stack for an IP key. Dereferences to `&str`.
pub struct KeyText<'a>(pub(super) TextRepr<'a>);

pub(super) enum TextRepr<'a> {
    Borrowed(&'a str),
    Written(StackText),
}

impl std::ops::Deref for KeyText<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        match &self.0 {
            TextRepr::Borrowed(text) => text,
            TextRepr::Written(text) => text.as_str(),
        }
    }
}

impl AsRef<str> for KeyText<'_> {
    fn as_ref(&self) -> &str {
        self
    }
}

impl PartialEq<str> for KeyText<'_> {
    fn eq(&self, other: &str) -> bool {
        **self == *other
    }
}

impl PartialEq<&str> for KeyText<'_> {
    fn eq(&self, other: &&str) -> bool {
        **self == **other
    }
}

impl PartialEq<String> for KeyText<'_> {
    fn eq(&self, other: &String) -> bool {
        **self == **other
    }
}

impl fmt::Debug for KeyText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl fmt::Display for KeyText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}

/// Room for `ip:` and the longest IPv6 address text.
pub(super) struct StackText {
    bytes: [u8; 64],
    len: usize,
}

impl Default for StackText {
    fn default() -> Self {
        StackText {
            bytes: [0; 64],
            len: 0,
        }
    }
}

impl StackText {
    pub(super) fn as_str(&self) -> &str {
        // Only whole `&str`s are ever written, so this is always valid.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

impl fmt::Write for StackText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        let slot = self.bytes.get_mut(self.len..end).ok_or(fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}
