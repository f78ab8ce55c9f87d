//! Maps a format's volume identity (host and disk, device numbers, file name)
//! to dense ids 0, 1, 2, ... in order of first appearance.
//!
//! Memory grows with the number of distinct volumes only, never with trace
//! length, and a one-entry cache makes the common case (the same volume as the
//! previous line) a byte comparison with no hashing.

use std::collections::HashMap;

use crate::error::FieldError;

/// Interns byte-string keys. Callers build the key in [`Self::key_buf`]
/// (cleared by [`Self::start`]) and then call [`Self::finish`], so lookups of
/// known volumes do not allocate.
#[derive(Debug, Default)]
pub(crate) struct Interner {
    ids: HashMap<Vec<u8>, u32>,
    key: Vec<u8>,
    last_key: Vec<u8>,
    last_id: Option<u32>,
}

impl Interner {
    /// Starts a new key and returns the buffer to write it into.
    #[inline]
    pub(crate) fn start(&mut self) -> &mut Vec<u8> {
        self.key.clear();
        &mut self.key
    }

    /// The volume of a device given by its major and minor numbers.
    #[inline]
    pub(crate) fn device(&mut self, major: u32, minor: u32, field: &'static str) -> Result<u32, FieldError> {
        let key = self.start();
        key.extend_from_slice(&major.to_le_bytes());
        key.extend_from_slice(&minor.to_le_bytes());
        self.finish(field)
    }

    /// Returns the id of the key built since [`Self::start`], assigning the
    /// next id if it is new. `field` names the field blamed if the ids run out.
    #[inline]
    pub(crate) fn finish(&mut self, field: &'static str) -> Result<u32, FieldError> {
        if let Some(id) = self.last_id {
            if self.key == self.last_key {
                return Ok(id);
            }
        }
        let id = match self.ids.get(self.key.as_slice()) {
            Some(&id) => id,
            None => {
                let id = u32::try_from(self.ids.len())
                    .map_err(|_| FieldError::new(field, "more than 2^32 distinct volumes"))?;
                self.ids.insert(self.key.clone(), id);
                id
            }
        };
        self.last_key.clear();
        self.last_key.extend_from_slice(&self.key);
        self.last_id = Some(id);
        Ok(id)
    }

    /// Interns the concatenation of `parts`, separated by a 0 byte.
    #[inline]
    pub(crate) fn intern(&mut self, parts: &[&[u8]], field: &'static str) -> Result<u32, FieldError> {
        let key = self.start();
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                key.push(0);
            }
            key.extend_from_slice(part);
        }
        self.finish(field)
    }

    /// Number of distinct volumes seen.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_ids_in_order_of_appearance() {
        let mut interner = Interner::default();
        assert_eq!(interner.intern(&[b"hm", b"0"], "h"), Ok(0));
        assert_eq!(interner.intern(&[b"hm", b"0"], "h"), Ok(0));
        assert_eq!(interner.intern(&[b"hm", b"1"], "h"), Ok(1));
        assert_eq!(interner.intern(&[b"web", b"0"], "h"), Ok(2));
        assert_eq!(interner.intern(&[b"hm", b"0"], "h"), Ok(0));
        assert_eq!(interner.intern(&[b"hm", b"1"], "h"), Ok(1));
        // The separator keeps ("a", "bc") and ("ab", "c") apart.
        assert_eq!(interner.intern(&[b"a", b"bc"], "h"), Ok(3));
        assert_eq!(interner.intern(&[b"ab", b"c"], "h"), Ok(4));
        assert_eq!(interner.len(), 5);
    }
}
