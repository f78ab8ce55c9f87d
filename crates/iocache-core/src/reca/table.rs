//! ReCA's workload categories and the cache
//! configuration of each (TPDS'18 §3.3, the "characteristics table" of
//! §4.2) are data, not code: users add and edit categories. The built-in
//! table is `crates/iocache-core/data/reca-categories.toml` (its comments
//! say where each number comes from); [`CategoryTable::parse`] reads any
//! file of the same shape, and [`CategoryTable::nearest`] picks a window's
//! category by minimum Euclidean distance (Algorithm 2, ANALYZE_WORKLOAD).
//!
//! The core depends on nothing but `thiserror`, so the file is read by the
//! small parser below, which accepts this subset of TOML: `#` comments,
//! `[[category]]` headers, and `key = value` lines whose value is a
//! "string" (no escapes), a number, or a one-line array of numbers. Errors name the file, the line and the field.

use std::fmt;

use thiserror::Error;

use crate::addr::LineSize;
use crate::config::WritePolicy;
use crate::policy::PolicySpec;
use crate::reca::classify::{AccessClass, RequestClass};
use crate::units::parse_byte_size;
use crate::IoKind;

/// The built-in table's text.
pub const BUILTIN_TABLE: &str = include_str!("../../data/reca-categories.toml");
/// The name errors in the built-in table are reported under.
pub const BUILTIN_TABLE_NAME: &str = "crates/iocache-core/data/reca-categories.toml";

/// How the built-in table is named where a table's source is shown or
/// given (statistics, `reca_table` in a lab grid): read from no file.
pub const BUILTIN_TABLE_SOURCE: &str = "built-in";

/// The dimensions of a workload vector, in order.
pub const FEATURE_NAMES: [&str; 7] = [
    "sequential_read",
    "sequential_write",
    "strided_read",
    "strided_write",
    "random_read",
    "random_write",
    "overlapped",
];

/// Which dimension a request class counts in (the overlapped flag is the
/// seventh, counted besides).
pub fn feature_of(class: &RequestClass) -> usize {
    class.access.index() * 2 + usize::from(class.kind == IoKind::Write)
}

/// A workload vector: the share of requests of each class, and the share
/// flagged overlapped ([`FEATURE_NAMES`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Features(pub [f64; 7]);

impl Features {
    /// The shares of `counts` (indexed by [`feature_of`], the overlapped
    /// count last) among `classified` requests; all zero when none.
    pub fn from_counts(counts: &[u64; 7], classified: u64) -> Features {
        let mut features = Features::default();
        if classified > 0 {
            for (f, &c) in features.0.iter_mut().zip(counts) {
                *f = c as f64 / classified as f64;
            }
        }
        features
    }

    pub fn distance(&self, other: &Features) -> f64 {
        self.0
            .iter()
            .zip(other.0.iter())
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f64>()
            .sqrt()
    }
}

impl fmt::Display for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let short = ["sr", "sw", "tr", "tw", "rr", "rw", "ov"];
        for (i, (name, v)) in short.iter().zip(self.0).enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{name}={v:.2}")?;
        }
        Ok(())
    }
}

/// How lines are chosen for eviction and whether a miss is admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EvictionRule {
    /// Least recently used; every miss admitted.
    Lru,
    /// Least priority (ties: least recently used); a miss admitted only if
    /// its priority is higher (Algorithm 1, CACHE_MANAGER).
    Priority,
    /// As `Priority`, among the least recently used lines only.
    PriorityLru,
}

impl EvictionRule {
    pub const NAMES: &'static str = "lru, priority, priority_lru";

    pub fn name(self) -> &'static str {
        match self {
            EvictionRule::Lru => "lru",
            EvictionRule::Priority => "priority",
            EvictionRule::PriorityLru => "priority_lru",
        }
    }

    pub fn parse(text: &str) -> Option<EvictionRule> {
        match text {
            "lru" => Some(EvictionRule::Lru),
            "priority" => Some(EvictionRule::Priority),
            "priority_lru" => Some(EvictionRule::PriorityLru),
            _ => None,
        }
    }
}

/// What one request adds to the priority of each line it touches
/// (Algorithm 2, PRIORITY_CALC).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Priorities {
    pub overlapped: f64,
    /// Indexed by [`AccessClass::index`].
    pub access: [f64; 3],
    pub read: [f64; 3],
    pub write: [f64; 3],
}

impl Priorities {
    /// PRIORITY_CALC for one request class.
    pub fn of(&self, class: &RequestClass) -> f64 {
        let a = class.access.index();
        let rw = match class.kind {
            IoKind::Read => self.read[a],
            IoKind::Write => self.write[a],
        };
        self.access[a] + rw + if class.overlapped { self.overlapped } else { 0.0 }
    }

    /// The weight of each count a line keeps: one per [`FEATURE_NAMES`]
    /// dimension (the last, overlapped requests).
    pub fn weights(&self) -> [f64; 7] {
        let mut w = [0.0; 7];
        for access in AccessClass::ALL {
            let a = access.index();
            w[2 * a] = self.access[a] + self.read[a];
            w[2 * a + 1] = self.access[a] + self.write[a];
        }
        w[6] = self.overlapped;
        w
    }
}

/// One workload category and the cache configuration chosen for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Category {
    pub name: String,
    pub features: Features,
    pub line_size: LineSize,
    pub write_policy: WritePolicy,
    pub eviction: EvictionRule,
    pub priorities: Priorities,
    pub neighbours: u32,
}

fn slash(v: &[f64; 3]) -> String {
    format!("{}/{}/{}", v[0], v[1], v[2])
}

impl Category {
    /// The `reca` replacement policy configured for this category, with
    /// the other parameters (`history`, ...) taken from `base` when it is a
    /// `reca` spec.
    pub fn policy_spec(&self, base: Option<&PolicySpec>) -> PolicySpec {
        let p = &self.priorities;
        let mut text = format!(
            "reca:evict={}:over={}:access={}:read={}:write={}:neighbours={}",
            self.eviction.name(),
            p.overlapped,
            slash(&p.access),
            slash(&p.read),
            slash(&p.write),
            self.neighbours
        );
        if let Some(base) = base.filter(|b| b.name() == "reca") {
            for key in crate::reca::policy::RECA_KEPT_PARAMS {
                if let Some(v) = base.params().get(key) {
                    text.push_str(&format!(":{key}={v}"));
                }
            }
        }
        text.parse()
            .expect("a category's numbers were checked when it was read")
    }
}

/// An error in a category table: where, which field, what is wrong.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("{file}:{line}: {field}: {reason}")]
pub struct TableError {
    pub file: String,
    /// 1-based; 0 when the error is about the file as a whole.
    pub line: usize,
    pub field: String,
    pub reason: String,
}

/// The categories a window of requests is matched against.
#[derive(Clone, Debug, PartialEq)]
pub struct CategoryTable {
    pub categories: Vec<Category>,
}

enum Value {
    Text(String),
    Number(f64),
    Numbers(Vec<f64>),
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::Text(_) => "a string",
            Value::Number(_) => "a number",
            Value::Numbers(_) => "an array",
        }
    }
}

/// A category being read: each field with the line it was on.
#[derive(Default)]
struct Draft {
    header_line: usize,
    fields: Vec<(String, Value, usize)>,
}

/// A category's fields besides `name`, the [`FEATURE_NAMES`] and
/// `neighbours`.
const SETTING_KEYS: [&str; 7] = [
    "line_size",
    "write_policy",
    "eviction",
    "overlapped_priority",
    "access_priority",
    "read_priority",
    "write_priority",
];
const PRIORITY_MAX: f64 = 1e6;

impl CategoryTable {
    /// The built-in table.
    pub fn builtin() -> CategoryTable {
        CategoryTable::parse(BUILTIN_TABLE, BUILTIN_TABLE_NAME).expect("the built-in table is valid")
    }

    pub fn find(&self, name: &str) -> Option<usize> {
        self.categories.iter().position(|c| c.name == name)
    }

    /// This table with only the category `name` (empty without it): a
    /// controller on it holds that category's configuration.
    pub fn only(&self, name: &str) -> CategoryTable {
        CategoryTable {
            categories: self
                .categories
                .iter()
                .filter(|c| c.name == name)
                .cloned()
                .collect(),
        }
    }

    /// The category nearest to `v` and the distance to every category (in
    /// table order). Ties go to the earlier category.
    pub fn nearest(&self, v: &Features) -> (usize, Vec<f64>) {
        let distances: Vec<f64> = self.categories.iter().map(|c| c.features.distance(v)).collect();
        let mut best = 0;
        for (i, d) in distances.iter().enumerate() {
            if *d < distances[best] {
                best = i;
            }
        }
        (best, distances)
    }

    /// Reads a table; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<CategoryTable, TableError> {
        let err = |line: usize, field: &str, reason: String| TableError {
            file: file.to_string(),
            line,
            field: field.to_string(),
            reason,
        };
        let mut drafts: Vec<Draft> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            let line = strip_comment(raw).trim();
            if line.is_empty() {
                continue;
            }
            if line.starts_with('[') {
                if line == "[[category]]" {
                    drafts.push(Draft {
                        header_line: n,
                        fields: Vec::new(),
                    });
                    continue;
                }
                return Err(err(n, line, "the only table header is [[category]]".into()));
            }
            let Some((key, value)) = line.split_once('=') else {
                return Err(err(n, line, "expected key = value".into()));
            };
            let key = key.trim();
            let Some(draft) = drafts.last_mut() else {
                return Err(err(n, key, "a field before the first [[category]]".into()));
            };
            let known = key == "name"
                || FEATURE_NAMES.contains(&key)
                || SETTING_KEYS.contains(&key)
                || key == "neighbours";
            if !known {
                return Err(err(
                    n,
                    key,
                    format!(
                        "unknown field; the fields are name, {}, {}, neighbours",
                        FEATURE_NAMES.join(", "),
                        SETTING_KEYS.join(", ")
                    ),
                ));
            }
            if draft.fields.iter().any(|(k, _, _)| k == key) {
                return Err(err(n, key, "given twice in one category".into()));
            }
            let value = parse_value(value.trim()).map_err(|reason| err(n, key, reason))?;
            draft.fields.push((key.to_string(), value, n));
        }
        if drafts.is_empty() {
            return Err(err(0, "[[category]]", "the table has no category".into()));
        }
        let mut categories: Vec<Category> = Vec::new();
        for d in drafts {
            let c = build(&d, &err)?;
            if categories.iter().any(|o| o.name == c.name) {
                let line = d
                    .fields
                    .iter()
                    .find(|f| f.0 == "name")
                    .map_or(d.header_line, |f| f.2);
                return Err(err(line, "name", format!("`{}` names two categories", c.name)));
            }
            categories.push(c);
        }
        Ok(CategoryTable { categories })
    }
}

fn strip_comment(line: &str) -> &str {
    let mut in_string = false;
    for (i, ch) in line.char_indices() {
        match ch {
            '"' => in_string = !in_string,
            '#' if !in_string => return &line[..i],
            _ => {}
        }
    }
    line
}

fn parse_number(text: &str) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{}` is not a number", text.trim()))?;
    if !v.is_finite() {
        return Err(format!("`{}` is not a finite number", text.trim()));
    }
    Ok(v)
}

fn parse_value(text: &str) -> Result<Value, String> {
    if let Some(rest) = text.strip_prefix('"') {
        let Some(inner) = rest.strip_suffix('"') else {
            return Err("a string must end with \" on the same line".into());
        };
        if inner.contains('"') || inner.contains('\\') {
            return Err("strings here take no quotes or escapes inside".into());
        }
        return Ok(Value::Text(inner.to_string()));
    }
    if let Some(rest) = text.strip_prefix('[') {
        let Some(inner) = rest.strip_suffix(']') else {
            return Err("an array must end with ] on the same line".into());
        };
        let items = inner.trim().trim_end_matches(',');
        if items.trim().is_empty() {
            return Ok(Value::Numbers(Vec::new()));
        }
        return items
            .split(',')
            .map(parse_number)
            .collect::<Result<_, _>>()
            .map(Value::Numbers);
    }
    parse_number(text).map(Value::Number)
}

fn build(d: &Draft, err: &dyn Fn(usize, &str, String) -> TableError) -> Result<Category, TableError> {
    let get = |key: &str| {
        d.fields
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, v, n)| (v, *n))
    };
    let required = |key: &str| {
        get(key).ok_or_else(|| {
            err(
                d.header_line,
                key,
                "missing in the category that starts here".into(),
            )
        })
    };
    let text = |key: &str| -> Result<(String, usize), TableError> {
        let (v, n) = required(key)?;
        match v {
            Value::Text(s) => Ok((s.clone(), n)),
            other => Err(err(n, key, format!("expected a string, found {}", other.kind()))),
        }
    };
    let number = |key: &str, default: Option<f64>, range: (f64, f64)| -> Result<f64, TableError> {
        let (v, n) = match (get(key), default) {
            (Some(found), _) => found,
            (None, Some(d)) => return Ok(d),
            (None, None) => required(key)?,
        };
        match v {
            Value::Number(x) if (range.0..=range.1).contains(x) => Ok(*x),
            Value::Number(x) => Err(err(
                n,
                key,
                format!("{x} is not between {} and {}", range.0, range.1),
            )),
            other => Err(err(n, key, format!("expected a number, found {}", other.kind()))),
        }
    };
    let triple = |key: &str| -> Result<[f64; 3], TableError> {
        let Some((v, n)) = get(key) else {
            return Ok([0.0; 3]);
        };
        match v {
            Value::Numbers(xs) if xs.len() == 3 => {
                if let Some(x) = xs.iter().find(|x| !(0.0..=PRIORITY_MAX).contains(*x)) {
                    return Err(err(n, key, format!("{x} is not between 0 and {PRIORITY_MAX}")));
                }
                Ok([xs[0], xs[1], xs[2]])
            }
            Value::Numbers(xs) => Err(err(
                n,
                key,
                format!(
                    "expected 3 numbers [sequential, strided, random], found {}",
                    xs.len()
                ),
            )),
            other => Err(err(n, key, format!("expected an array, found {}", other.kind()))),
        }
    };
    let (name, name_line) = text("name")?;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(err(
            name_line,
            "name",
            format!("`{name}`: use letters, digits, _ and - only"),
        ));
    }
    let mut features = [0.0; 7];
    for (i, key) in FEATURE_NAMES.iter().enumerate() {
        features[i] = number(key, None, (0.0, 1.0))?;
    }
    let (line_text, line_line) = text("line_size")?;
    let line_size = parse_byte_size(&line_text)
        .and_then(LineSize::new)
        .map_err(|e| err(line_line, "line_size", e.to_string()))?;
    let (wp_text, wp_line) = text("write_policy")?;
    let write_policy: WritePolicy = wp_text
        .parse()
        .map_err(|e: crate::CoreError| err(wp_line, "write_policy", e.to_string()))?;
    let (ev_text, ev_line) = text("eviction")?;
    let eviction = EvictionRule::parse(&ev_text).ok_or_else(|| {
        err(
            ev_line,
            "eviction",
            format!("`{ev_text}`; expected one of {}", EvictionRule::NAMES),
        )
    })?;
    let priorities = Priorities {
        overlapped: number("overlapped_priority", Some(0.0), (0.0, PRIORITY_MAX))?,
        access: triple("access_priority")?,
        read: triple("read_priority")?,
        write: triple("write_priority")?,
    };
    let neighbours = number("neighbours", Some(0.0), (0.0, 1024.0))?;
    if neighbours.fract() != 0.0 {
        let n = get("neighbours").map_or(d.header_line, |f| f.1);
        return Err(err(
            n,
            "neighbours",
            format!("{neighbours} is not a whole number"),
        ));
    }
    Ok(Category {
        name,
        features: Features(features),
        line_size,
        write_policy,
        eviction,
        priorities,
        neighbours: neighbours as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minimal(extra: &str) -> String {
        format!(
            "[[category]]\nname = \"a\"\nsequential_read = 1\nsequential_write = 0\nstrided_read = 0\n\
             strided_write = 0\nrandom_read = 0\nrandom_write = 0\noverlapped = 0\n\
             line_size = \"4KiB\"\nwrite_policy = \"wb\"\neviction = \"lru\"\n{extra}"
        )
    }

    #[test]
    fn the_builtin_table_has_the_five_categories_of_the_paper() {
        let t = CategoryTable::builtin();
        let names: Vec<&str> = t.categories.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "random_consumers",
                "sequential_producer_consumers",
                "random_producer_consumers",
                "archival_consumers",
                "large_file_generators"
            ]
        );
        for c in &t.categories {
            let shares: f64 = c.features.0[..6].iter().sum();
            assert!((shares - 1.0).abs() < 1e-9, "{}: {shares}", c.name);
            // Each category is its own nearest.
            assert_eq!(t.nearest(&c.features).0, t.find(&c.name).unwrap());
            // Its policy spec parses and prints back.
            let spec = c.policy_spec(None);
            assert_eq!(spec.to_string().parse::<PolicySpec>().unwrap(), spec);
        }
        assert_eq!(t.categories[4].neighbours, 16);
        assert_eq!(t.categories[0].line_size.bytes(), 4096);
        assert_eq!(t.categories[1].line_size.bytes(), 128 << 10);
    }

    #[test]
    fn the_nearest_category_is_the_one_at_least_euclidean_distance() {
        let t = CategoryTable::builtin();
        // Half random reads, half random writes: nearer random
        // producer/consumers (0.55/0.45) than random consumers (0.90/0.10).
        let mut v = Features::default();
        v.0[4] = 0.5;
        v.0[5] = 0.5;
        let (best, d) = t.nearest(&v);
        assert_eq!(t.categories[best].name, "random_producer_consumers");
        // The distances are the Euclidean ones, computed by hand for one.
        let rc = &t.categories[0].features.0;
        let by_hand = ((rc[0]).powi(2)
            + rc[1].powi(2)
            + rc[2].powi(2)
            + rc[3].powi(2)
            + (rc[4] - 0.5).powi(2)
            + (rc[5] - 0.5).powi(2)
            + rc[6].powi(2))
        .sqrt();
        assert!((d[0] - by_hand).abs() < 1e-12);
        assert!(d.iter().all(|&x| x >= d[best]));
        // All sequential writes: large file generators.
        let mut w = Features::default();
        w.0[1] = 1.0;
        assert_eq!(t.categories[t.nearest(&w).0].name, "large_file_generators");
        // All sequential reads, many overlapped: archival consumers.
        let mut a = Features::default();
        a.0[0] = 1.0;
        a.0[6] = 0.5;
        assert_eq!(t.categories[t.nearest(&a).0].name, "archival_consumers");
    }

    #[test]
    fn errors_name_the_file_the_line_and_the_field() {
        let e = CategoryTable::parse(&minimal("neighbours = 1.5\n"), "t.toml").unwrap_err();
        assert_eq!(
            (e.file.as_str(), e.line, e.field.as_str()),
            ("t.toml", 13, "neighbours")
        );
        let e = CategoryTable::parse(&minimal("colour = 3\n"), "t.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (13, "colour"));
        assert!(
            e.to_string().starts_with("t.toml:13: colour: unknown field"),
            "{e}"
        );
        let text = minimal("").replace("line_size = \"4KiB\"", "line_size = \"3KiB\"");
        let e = CategoryTable::parse(&text, "t.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (10, "line_size"));
        let text = minimal("").replace("random_read = 0\n", "");
        let e = CategoryTable::parse(&text, "t.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (1, "random_read"));
        assert!(e.reason.contains("missing"), "{e}");
        let e = CategoryTable::parse(&minimal("access_priority = [1, 2]\n"), "t.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (13, "access_priority"));
        let e = CategoryTable::parse(&minimal("eviction = \"lru\"\n"), "t.toml").unwrap_err();
        assert!(e.reason.contains("twice"), "{e}");
        let text = minimal("").replace("\"wb\"", "\"wq\"");
        let e = CategoryTable::parse(&text, "t.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (11, "write_policy"));
        let text = minimal("").replace("sequential_read = 1", "sequential_read = 1.5");
        assert_eq!(CategoryTable::parse(&text, "t.toml").unwrap_err().line, 3);
        let twice = format!("{}{}", minimal(""), minimal(""));
        let e = CategoryTable::parse(&twice, "t.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (14, "name"));
        let e = CategoryTable::parse("# nothing\n", "t.toml").unwrap_err();
        assert_eq!(e.field, "[[category]]");
        let e = CategoryTable::parse("x = 1\n", "t.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (1, "x"));
    }

    #[test]
    fn a_category_added_by_a_user_is_chosen_when_nearest() {
        let added = "\n[[category]]\nname = \"index_scanners\"\nsequential_read = 0\nsequential_write = 0\n\
                     strided_read = 0.9\nstrided_write = 0\nrandom_read = 0.1\nrandom_write = 0\noverlapped = 0\n\
                     line_size = \"16KiB\"\nwrite_policy = \"wa\"\neviction = \"priority\"\naccess_priority = [0, 5, 1]\n";
        let text = format!("{BUILTIN_TABLE}{added}");
        let t = CategoryTable::parse(&text, "mine.toml").unwrap();
        assert_eq!(t.categories.len(), 6);
        let mut v = Features::default();
        v.0[2] = 0.8;
        v.0[4] = 0.2;
        let (best, _) = t.nearest(&v);
        assert_eq!(t.categories[best].name, "index_scanners");
        assert_eq!(t.categories[best].line_size.bytes(), 16384);
    }

    #[test]
    fn comments_and_defaults() {
        let t = CategoryTable::parse(
            &minimal("access_priority = [1, 2, 3] # trailing\nread_priority = [0.5, 0, 0]\n"),
            "t.toml",
        )
        .unwrap();
        let c = &t.categories[0];
        assert_eq!(c.priorities.access, [1.0, 2.0, 3.0]);
        assert_eq!(c.priorities.write, [0.0; 3]);
        assert_eq!(c.neighbours, 0);
        let read_seq = RequestClass {
            access: AccessClass::Sequential,
            overlapped: true,
            kind: IoKind::Read,
        };
        assert_eq!(c.priorities.of(&read_seq), 1.5);
        assert_eq!(c.priorities.weights()[0], 1.5);
        assert_eq!(c.priorities.weights()[5], 3.0);
    }
}
