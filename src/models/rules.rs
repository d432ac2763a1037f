//! Ordered name-pattern rules: `[model.init]` and `[shardings]` map
//! patterns over parameter and input names (`params.*.w_up`, `x`) to what
//! those names get. The first rule that matches a name wins, as in Flax's
//! and MaxText's logical-axis rules; a rule that matches no name at all is
//! an error, so a typo never silently does nothing.
//!
//! Patterns are whole-name wildcards: `*` matches any run of characters
//! (dots included), `?` any one character; everything else is literal.

use wildmatch::WildMatch;

/// One rule: a pattern and what a name it matches gets.
#[derive(Clone, Debug)]
pub struct Rule<T> {
    /// The pattern as written.
    pub pattern: String,
    matcher: WildMatch,
    /// What a matching name gets.
    pub value: T,
}

impl<T> Rule<T> {
    /// Whether the pattern matches `name`.
    pub fn matches(&self, name: &str) -> bool {
        self.matcher.matches(name)
    }
}

/// Rules in order; the first match wins.
#[derive(Clone, Debug)]
pub struct Rules<T> {
    rules: Vec<Rule<T>>,
}

impl<T> Default for Rules<T> {
    fn default() -> Self {
        Rules { rules: Vec::new() }
    }
}

impl<T> Rules<T> {
    /// Rules from `(pattern, value)` pairs, in order.
    pub fn new(pairs: impl IntoIterator<Item = (String, T)>) -> Rules<T> {
        let rules = pairs
            .into_iter()
            .map(|(pattern, value)| Rule { matcher: WildMatch::new(&pattern), pattern, value })
            .collect();
        Rules { rules }
    }

    /// No rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The rules in order.
    pub fn iter(&self) -> impl Iterator<Item = &Rule<T>> {
        self.rules.iter()
    }

    /// The first rule matching `name`.
    pub fn first(&self, name: &str) -> Option<&Rule<T>> {
        self.rules.iter().find(|r| r.matcher.matches(name))
    }

    /// The patterns that match none of `names`.
    pub fn unmatched<'a>(&'a self, names: &[&str]) -> Vec<&'a str> {
        self.rules.iter().filter(|r| !names.iter().any(|n| r.matcher.matches(n))).map(|r| r.pattern.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_match_wins_and_stars_cross_dots() {
        let r = Rules::new([("params.*.b".to_string(), 1), ("params.*".to_string(), 2), ("x?".to_string(), 3)]);
        assert_eq!(r.first("params.layers.0.b").map(|r| r.value), Some(1));
        assert_eq!(r.first("params.layers.0.w").map(|r| r.value), Some(2));
        assert_eq!(r.first("x1").map(|r| r.value), Some(3));
        assert!(r.first("x").is_none());
        assert!(r.first("params").is_none());
        assert_eq!(r.unmatched(&["params.w", "y"]), vec!["params.*.b", "x?"]);
    }
}
