//! A persistent array of `u64` (a 32-way trie with shared, immutable
//! nodes): the extractor keeps hundreds of partial plans that differ in a
//! few entries of a table as large as the program, and copying a path of
//! the trie (three small nodes) instead of the table is what keeps it
//! linear in the program size.

use std::rc::Rc;

const BITS: u32 = 5;
const WIDTH: usize = 1 << BITS;

#[derive(Clone, Debug)]
enum Node {
    Leaf([u64; WIDTH]),
    Inner([Option<Rc<Node>>; WIDTH]),
}

/// A persistent array of `len` entries, all zero initially.
#[derive(Clone, Debug)]
pub struct PArray {
    root: Option<Rc<Node>>,
    depth: u32,
}

impl PArray {
    /// An all-zero array able to hold `len` entries.
    pub fn new(len: usize) -> PArray {
        let mut depth = 1;
        while (WIDTH as u64).pow(depth) < len.max(1) as u64 {
            depth += 1;
        }
        PArray { root: None, depth }
    }

    /// Entry `i`.
    pub fn get(&self, i: usize) -> u64 {
        let mut node = match &self.root {
            Some(n) => n,
            None => return 0,
        };
        let mut level = self.depth;
        loop {
            level -= 1;
            let slot = (i >> (level * BITS)) & (WIDTH - 1);
            match &**node {
                Node::Leaf(vals) => return vals[slot],
                Node::Inner(kids) => match &kids[slot] {
                    Some(k) => node = k,
                    None => return 0,
                },
            }
        }
    }

    /// A copy with entry `i` set to `v` (sharing everything else).
    pub fn set(&self, i: usize, v: u64) -> PArray {
        PArray { root: Some(set_in(self.root.as_ref(), self.depth, i, v)), depth: self.depth }
    }
}

fn set_in(node: Option<&Rc<Node>>, level: u32, i: usize, v: u64) -> Rc<Node> {
    let slot = (i >> ((level - 1) * BITS)) & (WIDTH - 1);
    if level == 1 {
        let mut vals = match node.map(|n| &**n) {
            Some(Node::Leaf(vals)) => *vals,
            _ => [0; WIDTH],
        };
        vals[slot] = v;
        return Rc::new(Node::Leaf(vals));
    }
    let mut kids: [Option<Rc<Node>>; WIDTH] = match node.map(|n| &**n) {
        Some(Node::Inner(kids)) => kids.clone(),
        _ => Default::default(),
    };
    kids[slot] = Some(set_in(kids[slot].as_ref(), level - 1, i, v));
    Rc::new(Node::Inner(kids))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persistent_updates() {
        let a = PArray::new(5000);
        let b = a.set(4321, 7).set(0, 1).set(31, 2).set(32, 3);
        let c = b.set(4321, 9);
        assert_eq!((a.get(4321), b.get(4321), c.get(4321)), (0, 7, 9));
        assert_eq!((c.get(0), c.get(31), c.get(32), c.get(33)), (1, 2, 3, 0));
        let small = PArray::new(1).set(0, 5);
        assert_eq!(small.get(0), 5);
    }
}
