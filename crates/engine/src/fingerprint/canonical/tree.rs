//! The parsed body as a flat arena ([`Tree`]) and the canonical writer
//! over it, and the parser's frame of one open container ([`Frame`]).
//!
//! Kept apart from the parser: this half owns the layout and the output,
//! both walked with explicit stacks, never one call per nesting level.

use std::ops::Range;

use super::write_string;

/// Index of a node in [`Tree::nodes`]; `SKIPPED` marks an ignored member
/// or item.
pub(super) type NodeId = u32;
pub(super) const SKIPPED: NodeId = NodeId::MAX;

/// A value's canonical text, or its children.
#[derive(Debug, Clone)]
pub(super) enum Node {
    /// Canonical text equal to the body's own bytes at this range: numbers,
    /// literals and strings without escapes.
    Source(Range<usize>),
    /// Canonical text in [`Tree::text`]: strings that had escapes.
    Text(Range<usize>),
    /// Children in [`Tree::items`].
    Array(Range<usize>),
    /// Sorted members in [`Tree::members`].
    Object(Range<usize>),
}

/// A member name: its decoded bytes, in the body (no escapes) or in
/// [`Tree::text`].
#[derive(Debug, Clone)]
pub(super) enum Name {
    Source(Range<usize>),
    Text(Range<usize>),
}

#[derive(Debug, Clone)]
pub(super) struct Member {
    pub(super) name: Name,
    pub(super) value: NodeId,
}

/// The parsed body, flat.
#[derive(Debug, Default)]
pub(super) struct Tree {
    pub(super) nodes: Vec<Node>,
    pub(super) items: Vec<NodeId>,
    pub(super) members: Vec<Member>,
    /// Canonical text of escaped strings and decoded member names.
    pub(super) text: Vec<u8>,
    pub(super) work: u64,
}

impl Tree {
    pub(super) fn push(&mut self, node: Node) -> NodeId {
        self.work += 1;
        let id = NodeId::try_from(self.nodes.len()).unwrap_or(SKIPPED);
        self.nodes.push(node);
        id
    }

    pub(super) fn name<'a>(&'a self, body: &'a [u8], name: &Name) -> &'a [u8] {
        match name {
            Name::Source(r) => &body[r.clone()],
            Name::Text(r) => &self.text[r.clone()],
        }
    }

    /// Writes `root` with an explicit stack of pending steps.
    pub(super) fn emit(&self, body: &[u8], root: NodeId, out: &mut Vec<u8>) {
        enum Step {
            Node(NodeId),
            Name(usize),
            Byte(u8),
        }
        let mut steps = vec![Step::Node(root)];
        while let Some(step) = steps.pop() {
            match step {
                Step::Byte(b) => out.push(b),
                Step::Name(m) => {
                    let name = self.name(body, &self.members[m].name);
                    match std::str::from_utf8(name) {
                        Ok(s) => write_string(s, out),
                        Err(_) => out.extend_from_slice(b"\"\""),
                    }
                }
                Step::Node(id) => match self.nodes.get(id as usize) {
                    Some(Node::Source(r)) => out.extend_from_slice(&body[r.clone()]),
                    Some(Node::Text(r)) => out.extend_from_slice(&self.text[r.clone()]),
                    Some(Node::Array(r)) => {
                        out.push(b'[');
                        steps.push(Step::Byte(b']'));
                        let kept: Vec<NodeId> = self.items[r.clone()]
                            .iter()
                            .copied()
                            .filter(|&i| i != SKIPPED)
                            .collect();
                        for (n, &item) in kept.iter().enumerate().rev() {
                            steps.push(Step::Node(item));
                            if n > 0 {
                                steps.push(Step::Byte(b','));
                            }
                        }
                    }
                    Some(Node::Object(r)) => {
                        out.push(b'{');
                        steps.push(Step::Byte(b'}'));
                        let kept: Vec<usize> = r
                            .clone()
                            .filter(|&m| self.members[m].value != SKIPPED)
                            .collect();
                        for (n, &m) in kept.iter().enumerate().rev() {
                            steps.push(Step::Node(self.members[m].value));
                            steps.push(Step::Byte(b':'));
                            steps.push(Step::Name(m));
                            if n > 0 {
                                steps.push(Step::Byte(b','));
                            }
                        }
                    }
                    None => {}
                },
            }
        }
    }
}

/// An open array or object within [`MAX_JSON_DEPTH`](super::MAX_JSON_DEPTH).
#[derive(Debug)]
pub(super) struct Frame {
    pub(super) object: bool,
    pub(super) items: Vec<NodeId>,
    pub(super) members: Vec<Member>,
    /// The name of the member whose value is being read.
    pub(super) name: Option<Name>,
    /// The next array index.
    pub(super) index: usize,
    /// Ignored pointers that match this container's path so far.
    pub(super) live: Vec<usize>,
    /// The value being read is ignored.
    pub(super) skip_next: bool,
}

impl Frame {
    pub(super) fn new(object: bool, live: Vec<usize>) -> Self {
        Self {
            object,
            items: Vec::new(),
            members: Vec::new(),
            name: None,
            index: 0,
            live,
            skip_next: false,
        }
    }
}
