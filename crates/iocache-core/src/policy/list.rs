//! Intrusive doubly linked lists over dense `u32` indices.
//!
//! Replacement policies keep their queues as links in arrays indexed by slot
//! (or ghost-entry) id: O(1) unlink and push with no allocation per access.

pub const NIL: u32 = u32::MAX;

/// Links for many nodes; each node belongs to at most one [`ListHead`] at a time.
#[derive(Clone, Debug)]
pub struct Links {
    prev: Vec<u32>,
    next: Vec<u32>,
}

/// One list: `head` is the most recently inserted end, `tail` the oldest.
#[derive(Clone, Copy, Debug)]
pub struct ListHead {
    pub head: u32,
    pub tail: u32,
    pub len: u32,
}

impl Default for ListHead {
    fn default() -> Self {
        ListHead {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

impl Links {
    pub fn new(nodes: usize) -> Self {
        Links {
            prev: vec![NIL; nodes],
            next: vec![NIL; nodes],
        }
    }

    pub fn push_head(&mut self, list: &mut ListHead, node: u32) {
        let n = node as usize;
        self.prev[n] = NIL;
        self.next[n] = list.head;
        if list.head != NIL {
            self.prev[list.head as usize] = node;
        } else {
            list.tail = node;
        }
        list.head = node;
        list.len += 1;
    }

    pub fn push_tail(&mut self, list: &mut ListHead, node: u32) {
        let n = node as usize;
        self.next[n] = NIL;
        self.prev[n] = list.tail;
        if list.tail != NIL {
            self.next[list.tail as usize] = node;
        } else {
            list.head = node;
        }
        list.tail = node;
        list.len += 1;
    }

    pub fn unlink(&mut self, list: &mut ListHead, node: u32) {
        let n = node as usize;
        let (p, x) = (self.prev[n], self.next[n]);
        if p != NIL {
            self.next[p as usize] = x;
        } else {
            debug_assert_eq!(list.head, node);
            list.head = x;
        }
        if x != NIL {
            self.prev[x as usize] = p;
        } else {
            debug_assert_eq!(list.tail, node);
            list.tail = p;
        }
        self.prev[n] = NIL;
        self.next[n] = NIL;
        list.len -= 1;
    }

    pub fn move_to_head(&mut self, list: &mut ListHead, node: u32) {
        if list.head != node {
            self.unlink(list, node);
            self.push_head(list, node);
        }
    }

    pub fn pop_tail(&mut self, list: &mut ListHead) -> Option<u32> {
        let tail = list.tail;
        if tail == NIL {
            return None;
        }
        self.unlink(list, tail);
        Some(tail)
    }

    /// The node after `node` toward the tail.
    pub fn next(&self, node: u32) -> u32 {
        self.next[node as usize]
    }

    /// Iterates from head (newest) to tail (oldest).
    pub fn iter<'a>(&'a self, list: &ListHead) -> impl Iterator<Item = u32> + 'a {
        let mut at = list.head;
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let node = at;
            at = self.next[node as usize];
            Some(node)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_unlink_pop() {
        let mut links = Links::new(4);
        let mut list = ListHead::default();
        for n in 0..4 {
            links.push_head(&mut list, n);
        }
        assert_eq!(links.iter(&list).collect::<Vec<_>>(), vec![3, 2, 1, 0]);
        links.unlink(&mut list, 2);
        links.move_to_head(&mut list, 0);
        assert_eq!(links.iter(&list).collect::<Vec<_>>(), vec![0, 3, 1]);
        assert_eq!(links.pop_tail(&mut list), Some(1));
        links.push_tail(&mut list, 2);
        assert_eq!(links.iter(&list).collect::<Vec<_>>(), vec![0, 3, 2]);
        assert_eq!(list.len, 3);
        assert_eq!(links.pop_tail(&mut list), Some(2));
        assert_eq!(links.pop_tail(&mut list), Some(3));
        assert_eq!(links.pop_tail(&mut list), Some(0));
        assert_eq!(links.pop_tail(&mut list), None);
        assert_eq!(list.len, 0);
    }
}
