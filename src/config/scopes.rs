//! A job's `scopes` key: where the scopes of a scoped job come from. A
//! scoped job's run for a period is one run per scope, keyed
//! `<job>:<period>@<scope>` (see [`crate::key::Scope`]).
//!
//! `scopes = ["seller-1", "seller-2"]` is a fixed list (1 to
//! `MAX_LISTED_SCOPES` distinct scopes); `scopes = { query = "SELECT …" }`
//! is one SQL query whose first column is a scope id, read by the producer
//! (and by `enqueue --all-scopes`) inside the statement that enqueues, so a
//! scope added to the table gets its runs from the next tick on. A query's
//! ids are checked in that statement: an id that is not a valid scope is
//! reported and never enqueued. The query runs with the producer's role,
//! which reads every table of the schema (`batchonce roles`).

use crate::key::{Scope, MAX_KEY_LEN};

/// Most scopes a list in the configuration may hold; a longer set belongs
/// in a table and a query.
pub const MAX_LISTED_SCOPES: usize = 10_000;
/// Longest scope query.
pub const MAX_QUERY_BYTES: usize = 16 * 1024;

/// Where a scoped job's scopes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopeSource {
    /// A fixed list from the configuration.
    List(Vec<Scope>),
    /// One SQL query; its first column is read as text.
    Query(String),
}

impl ScopeSource {
    /// Reads the value of a job's `scopes` key.
    pub(super) fn parse(v: &toml::Value) -> Result<Self, String> {
        match v {
            toml::Value::Array(items) => {
                if items.is_empty() || items.len() > MAX_LISTED_SCOPES {
                    return Err(format!(
                        "expected 1 to {MAX_LISTED_SCOPES} scopes, found {}; a longer set belongs in a table, read with scopes = {{ query = \"SELECT …\" }}",
                        items.len()
                    ));
                }
                let mut out: Vec<Scope> = Vec::with_capacity(items.len());
                let mut seen = std::collections::HashSet::new();
                for item in items {
                    let s = item.as_str().ok_or_else(|| {
                        format!("expected an array of strings, found {}", item.type_str())
                    })?;
                    let scope = Scope::parse(s).map_err(|e| e.to_string())?;
                    if !seen.insert(scope.clone()) {
                        return Err(format!("scope {s:?} is listed twice"));
                    }
                    out.push(scope);
                }
                Ok(Self::List(out))
            }
            toml::Value::Table(t) => {
                if let Some(k) = t.keys().find(|k| k.as_str() != "query") {
                    return Err(format!("unknown key {k:?} (expected query)"));
                }
                let q = t
                    .get("query")
                    .ok_or("expected { query = \"SELECT …\" }")?
                    .as_str()
                    .ok_or("query: expected a string")?;
                let q = q.trim();
                if q.is_empty() || q.len() > MAX_QUERY_BYTES {
                    return Err(format!(
                        "query: expected one SELECT of 1 to {MAX_QUERY_BYTES} bytes"
                    ));
                }
                // The query is placed inside the enqueue statement as a
                // subquery: one statement, never a list of them.
                if q.contains(';') || q.contains('\0') {
                    return Err(
                        "query: expected one SELECT without ';' (it runs as a subquery of the enqueue statement)"
                            .to_owned(),
                    );
                }
                Ok(Self::Query(q.to_owned()))
            }
            other => Err(format!(
                "expected an array of scopes or {{ query = \"SELECT …\" }}, found {}",
                other.type_str()
            )),
        }
    }

    /// What the process registry records, so that processes that disagree
    /// on a job's scopes show as drift.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Self::List(l) => serde_json::json!(l.iter().map(Scope::as_str).collect::<Vec<_>>()),
            Self::Query(q) => serde_json::json!({ "query": q }),
        }
    }
}

/// The longest scope a job's keys have room for: a key is at most 120
/// characters, `<job>:<period>@<scope>` plus `.p<n>` for a partition.
pub fn room_for_scope(job: &str, period_len: usize, partitions: u16) -> usize {
    let suffix = if partitions > 1 { 5 } else { 0 };
    MAX_KEY_LEN.saturating_sub(job.len() + 1 + period_len + 1 + suffix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<ScopeSource, String> {
        let t: toml::Table = toml::from_str(&format!("scopes = {s}")).unwrap();
        ScopeSource::parse(&t["scopes"])
    }

    #[test]
    fn lists_and_queries() {
        assert_eq!(
            parse(r#"["seller-1", "seller-2"]"#).unwrap(),
            ScopeSource::List(vec![
                Scope::parse("seller-1").unwrap(),
                Scope::parse("seller-2").unwrap()
            ])
        );
        assert_eq!(
            parse(r#"{ query = " SELECT id FROM sellers " }"#).unwrap(),
            ScopeSource::Query("SELECT id FROM sellers".to_owned())
        );
        for (bad, says) in [
            ("[]", "expected 1 to 10000 scopes"),
            (r#"["Seller-1"]"#, "invalid scope"),
            (r#"["a", "a"]"#, "listed twice"),
            ("[1]", "expected an array of strings"),
            ("{ query = \"\" }", "expected one SELECT"),
            ("{ query = \"SELECT 1; DROP TABLE orders\" }", "without ';'"),
            ("{ sql = \"SELECT 1\" }", "unknown key"),
            ("\"seller-1\"", "expected an array of scopes"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let many: Vec<String> = (0..=MAX_LISTED_SCOPES)
            .map(|i| format!("\"s{i}\""))
            .collect();
        assert!(parse(&format!("[{}]", many.join(","))).is_err());
    }

    #[test]
    fn room_is_what_the_key_leaves() {
        assert_eq!(
            room_for_scope("daily-settlement", 10, 1),
            120 - 16 - 1 - 10 - 1
        );
        assert_eq!(
            room_for_scope("daily-settlement", 10, 4),
            120 - 16 - 1 - 10 - 1 - 5
        );
    }
}
