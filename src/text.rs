//! Small pieces of wording shared by the commands' human-readable output,
//! so counts read as English ("1 request", "2 requests") everywhere.

/// `n` and the noun, singular for one: `count(1, "request")` is
/// "1 request", `count(3, "line")` "3 lines". Nouns here take an `s`.
pub fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    use super::count;

    #[test]
    fn singular_for_one_only() {
        assert_eq!(count(0, "request"), "0 requests");
        assert_eq!(count(1, "request"), "1 request");
        assert_eq!(count(2, "malformed line"), "2 malformed lines");
    }
}
