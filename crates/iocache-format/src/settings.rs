//! What a superblock's settings area records, typed: the knobs an operator
//! changed while the cache served (to bring them back at the next start),
//! the line size ReCA chose (for the next start), and, for people reading
//! a dump, the configuration the cache was opened with.
//!
//! The area holds [`SettingsRecord::encode`]'s text: a version token
//! `v=1`, then space-separated tokens:
//!
//! - `KEY=VALUE`: a knob as configured at the last start (informational);
//! - `set:KEY=VALUE|CONFIGURED`: a knob changed at run time to `VALUE`,
//!   over the configured value `CONFIGURED`;
//! - `reca:line_size=CHOSEN|CONFIGURED`: ReCA's line size in bytes, chosen
//!   over the configured one.
//!
//! Text without a version token was written before the record had one
//! (the same tokens); it is read the same way and written back with the
//! version at the next update. [`SettingsRecord::decode`] never refuses a
//! text: a token it cannot read, or a whole text of a later version, is
//! kept aside in [`SettingsRecord::unreadable`] for the start to report,
//! since losing a run-time change must not keep a cache from starting.

/// The version [`SettingsRecord::encode`] writes.
pub const SETTINGS_VERSION: u32 = 1;

const VERSION_MARK: &str = "v=";
const CHANGE_MARK: &str = "set:";
const RECA_LINE_MARK: &str = "reca:line_size=";

/// The settings area of a superblock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SettingsRecord {
    /// The configuration the cache was opened with, as `(key, value)`:
    /// for people reading a dump; a start does not read it back.
    pub opened_with: Vec<(String, String)>,
    /// Knobs changed at run time, in the order written.
    pub changes: Vec<RecordedChange>,
    /// ReCA's choice of line size, if it made one.
    pub reca_line: Option<RecaLineSize>,
    /// Tokens this version cannot read (filled by `decode` only; never
    /// written back).
    pub unreadable: Vec<String>,
}

/// A knob changed at run time: its key, the value in force, and the
/// configured value that value replaced (in the syntax of the knobs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordedChange {
    pub key: String,
    pub value: String,
    pub configured: String,
}

/// ReCA's line size, and the configured one it was chosen over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecaLineSize {
    pub chosen_bytes: u64,
    pub configured_bytes: u64,
}

/// Whether `text` can stand as a value in a token: not empty, no
/// whitespace, no `|`.
fn is_token_text(text: &str) -> bool {
    !text.is_empty() && !text.contains(|c: char| c.is_whitespace() || c == '|')
}

/// Whether `key` can stand as a key: a value with no `=` or `:` either.
fn is_key(key: &str) -> bool {
    is_token_text(key) && !key.contains(['=', ':'])
}

impl SettingsRecord {
    /// The record's text. A key or value that could not be read back (empty,
    /// or with whitespace or `|` in it) is left out, and so is a key with
    /// `=` in it.
    pub fn encode(&self) -> String {
        let mut tokens = vec![format!("{VERSION_MARK}{SETTINGS_VERSION}")];
        for (key, value) in &self.opened_with {
            if is_key(key) && is_token_text(value) {
                tokens.push(format!("{key}={value}"));
            }
        }
        for c in &self.changes {
            if is_key(&c.key) && is_token_text(&c.value) && is_token_text(&c.configured) {
                tokens.push(format!("{CHANGE_MARK}{}={}|{}", c.key, c.value, c.configured));
            }
        }
        if let Some(line) = self.reca_line {
            tokens.push(format!(
                "{RECA_LINE_MARK}{}|{}",
                line.chosen_bytes, line.configured_bytes
            ));
        }
        tokens.join(" ")
    }

    /// Reads a settings area's text (of this version, or written before
    /// versions; see the module doc).
    pub fn decode(text: &str) -> SettingsRecord {
        let mut record = SettingsRecord::default();
        let mut tokens = text.split_whitespace().peekable();
        if let Some(version) = tokens.peek().and_then(|t| t.strip_prefix(VERSION_MARK)) {
            if version != SETTINGS_VERSION.to_string() {
                record.unreadable = text.split_whitespace().map(str::to_string).collect();
                return record;
            }
            tokens.next();
        }
        for token in tokens {
            if !record.read_token(token) {
                record.unreadable.push(token.to_string());
            }
        }
        record
    }

    /// Adds what one token says; false if it says nothing this version reads.
    fn read_token(&mut self, token: &str) -> bool {
        if let Some(entry) = token.strip_prefix(CHANGE_MARK) {
            let Some((setting, configured)) = entry.rsplit_once('|') else {
                return false;
            };
            let Some((key, value)) = setting.split_once('=') else {
                return false;
            };
            if !(is_key(key) && is_token_text(value) && is_token_text(configured)) {
                return false;
            }
            self.changes.push(RecordedChange {
                key: key.to_string(),
                value: value.to_string(),
                configured: configured.to_string(),
            });
            return true;
        }
        if let Some(entry) = token.strip_prefix(RECA_LINE_MARK) {
            let parsed = entry
                .split_once('|')
                .and_then(|(chosen, configured)| Some((chosen.parse().ok()?, configured.parse().ok()?)));
            let Some((chosen_bytes, configured_bytes)) = parsed else {
                return false;
            };
            self.reca_line = Some(RecaLineSize {
                chosen_bytes,
                configured_bytes,
            });
            return true;
        }
        match token.split_once('=') {
            Some((key, value)) if is_key(key) && is_token_text(value) => {
                self.opened_with.push((key.to_string(), value.to_string()));
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SettingsRecord {
        SettingsRecord {
            opened_with: vec![
                ("write_policy".into(), "wb".into()),
                ("policy".into(), "s3fifo:ghost=0.9".into()),
            ],
            changes: vec![RecordedChange {
                key: "policy".into(),
                value: "arc".into(),
                configured: "s3fifo:ghost=0.9".into(),
            }],
            reca_line: Some(RecaLineSize {
                chosen_bytes: 131072,
                configured_bytes: 4096,
            }),
            unreadable: Vec::new(),
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let text = sample().encode();
        assert!(text.starts_with("v=1 "), "{text}");
        assert_eq!(SettingsRecord::decode(&text), sample());
    }

    #[test]
    fn text_from_before_versions_is_read_the_same_way() {
        let old = "write_policy=wb policy=s3fifo:ghost=0.9 set:policy=arc|s3fifo:ghost=0.9 \
                   reca:line_size=131072|4096";
        assert_eq!(SettingsRecord::decode(old), sample());
        assert_eq!(SettingsRecord::decode(""), SettingsRecord::default());
    }

    #[test]
    fn what_cannot_be_read_is_set_aside_not_refused() {
        let r = SettingsRecord::decode("v=1 set:policy=arc set:x|y reca:line_size=big|4096 :=1 lookup=fine");
        assert_eq!(r.opened_with, vec![("lookup".to_string(), "fine".to_string())]);
        assert!(r.changes.is_empty() && r.reca_line.is_none());
        assert_eq!(
            r.unreadable,
            ["set:policy=arc", "set:x|y", "reca:line_size=big|4096", ":=1"]
        );
        // A later version's record is not guessed at.
        let later = SettingsRecord::decode("v=2 set:policy=arc|lru");
        assert!(later.changes.is_empty());
        assert_eq!(later.unreadable, ["v=2", "set:policy=arc|lru"]);
    }

    #[test]
    fn what_could_not_be_read_back_is_not_written() {
        let mut r = sample();
        r.opened_with.push(("bad key".into(), "x".into()));
        r.changes.push(RecordedChange {
            key: "seq_cutoff".into(),
            value: "4 MiB".into(),
            configured: "off".into(),
        });
        r.unreadable.push("junk".into());
        assert_eq!(SettingsRecord::decode(&r.encode()), sample());
    }
}
