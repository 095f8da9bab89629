//! Texts made on every request (keys, bodies) put together from pieces.

/// `parts` joined, in one allocation of exactly their length: what
/// `format!` would give for plain pieces, at a fraction of its cost.
pub(crate) fn concat(parts: &[&str]) -> String {
    let mut text = String::with_capacity(parts.iter().map(|part| part.len()).sum());
    for part in parts {
        text.push_str(part);
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn joins_in_order_at_exact_capacity() {
        let text = super::concat(&["ip:", "10.0.0.1", "", ":0"]);
        assert_eq!(text, "ip:10.0.0.1:0");
        assert_eq!(text.capacity(), text.len());
    }
}
