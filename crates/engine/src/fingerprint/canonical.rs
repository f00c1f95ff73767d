//! Canonical JSON in one pass, without recursion.
//!
//! The body is client input, so its shape must never decide how much stack
//! or time the gateway spends on it. This module reads the body once with
//! an explicit stack (no call per nesting level), builds a flat arena of
//! nodes, sorts each object's members, and writes the canonical form with a
//! second explicit stack. Every byte of the body is read once, every node is
//! written once, and the memory used is linear in the body: a body 10,000
//! levels deep costs what any other 20 KB body costs.
//!
//! Nesting deeper than [`MAX_JSON_DEPTH`] is refused ([`BodyError::TooDeep`])
//! once the whole body is known to be valid JSON: an upstream parser (most
//! stop at 128 levels, some overflow their own stack) would fail on it or
//! worse, and no real request nests that far. A body that is not JSON is
//! never refused for its depth; it is hashed as raw bytes as before.
//!
//! What is accepted matches `serde_json` exactly (RFC 8259: no trailing
//! commas, no leading zeros, no control characters in strings, UTF-8),
//! except that a string with an unpaired UTF-16 surrogate escape
//! (`"\ud800"`) has no canonical text: such a body is hashed as raw bytes.
//! The canonical form is the one earlier versions produced, byte for byte,
//! so fingerprints of stored records stay valid across an upgrade.

use super::BodyError;

mod tree;

use tree::{Frame, Member, Name, Node, NodeId, SKIPPED, Tree};

/// The deepest nesting of arrays and objects a JSON body may have.
pub const MAX_JSON_DEPTH: usize = 128;

/// Why a body has no canonical form.
#[derive(Debug)]
pub(super) enum Failure {
    /// Not JSON (or JSON without a canonical text): hash it another way.
    NotJson,
    /// JSON that is refused: it must not be forwarded.
    Refused(BodyError),
}

/// Ignored JSON pointers, each split into unescaped reference tokens.
#[derive(Debug, Default)]
pub(super) struct Pointers(Vec<Vec<String>>);

impl Pointers {
    /// RFC 6901 pointers; ones without a leading `/` (including the whole
    /// document, `""`) are left out.
    pub(super) fn new(ignore: &[String]) -> Self {
        Self(
            ignore
                .iter()
                .filter_map(|p| p.strip_prefix('/'))
                .map(|p| {
                    p.split('/')
                        .map(|t| t.replace("~1", "/").replace("~0", "~"))
                        .collect()
                })
                .collect(),
        )
    }
}

/// Writes the canonical form of `body` into `out`, leaving out `ignore`.
pub(super) fn write(body: &[u8], ignore: &Pointers, out: &mut Vec<u8>) -> Result<(), Failure> {
    write_counting(body, ignore, out).0
}

/// [`write`], also returning the units of work done: bytes read, nodes
/// built, member and item slots moved, key comparisons made and bytes
/// written. Tests use it to show the cost is linear in the body.
pub(super) fn write_counting(
    body: &[u8],
    ignore: &Pointers,
    out: &mut Vec<u8>,
) -> (Result<(), Failure>, u64) {
    // The whole value must be UTF-8 (as `serde_json` requires); checked
    // once here so strings can be sliced without checking again.
    if std::str::from_utf8(body).is_err() {
        return (Err(Failure::NotJson), body.len() as u64);
    }
    let mut tree = Tree::default();
    let parsed = Parser::new(body, ignore).run(&mut tree);
    let mut work = tree.work;
    let result = parsed.map(|root| {
        let before = out.len();
        tree.emit(body, root, out);
        work += (out.len() - before) as u64;
    });
    (result, work)
}

struct Parser<'a> {
    body: &'a [u8],
    pos: usize,
    pointers: &'a Pointers,
    frames: Vec<Frame>,
    /// Kinds (`true` = object) of containers open beyond [`MAX_JSON_DEPTH`]:
    /// only validated, never built.
    deep: Vec<bool>,
    /// Ignored pointers for the container about to open.
    next_live: Vec<usize>,
    /// Scratch space for decoding strings.
    scratch: String,
}

impl<'a> Parser<'a> {
    fn new(body: &'a [u8], pointers: &'a Pointers) -> Self {
        Self {
            body,
            pos: 0,
            pointers,
            frames: Vec::new(),
            deep: Vec::new(),
            next_live: (0..pointers.0.len()).collect(),
            scratch: String::new(),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.body.get(self.pos).copied()
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Result<(), Failure> {
        self.skip_whitespace();
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(Failure::NotJson)
        }
    }

    fn depth(&self) -> usize {
        self.frames.len() + self.deep.len()
    }

    fn in_object(&self) -> bool {
        match self.deep.last() {
            Some(&object) => object,
            None => self.frames.last().is_some_and(|f| f.object),
        }
    }

    /// Reads the body; returns the root node. Deeper than the limit, the
    /// rest is validated without building nodes and the answer is
    /// [`BodyError::TooDeep`].
    fn run(mut self, tree: &mut Tree) -> Result<NodeId, Failure> {
        let result = self.read_value_loop(tree);
        tree.work += self.pos as u64;
        let root = result?;
        self.skip_whitespace();
        if self.pos != self.body.len() {
            return Err(Failure::NotJson);
        }
        root.ok_or(Failure::Refused(BodyError::TooDeep {
            limit: MAX_JSON_DEPTH,
        }))
    }

    /// The main loop: a value starts, or a container goes on or closes.
    /// Returns `None` as the root when the body nests too deep.
    fn read_value_loop(&mut self, tree: &mut Tree) -> Result<Option<NodeId>, Failure> {
        let mut too_deep = false;
        loop {
            // A value starts here.
            self.skip_whitespace();
            let mut done = match self.peek().ok_or(Failure::NotJson)? {
                open @ (b'[' | b'{') => {
                    self.pos += 1;
                    let object = open == b'{';
                    if self.depth() >= MAX_JSON_DEPTH {
                        too_deep = true;
                        self.deep.push(object);
                    } else {
                        let live = std::mem::take(&mut self.next_live);
                        self.frames.push(Frame::new(object, live));
                    }
                    self.skip_whitespace();
                    let close = if object { b'}' } else { b']' };
                    if self.peek() == Some(close) {
                        self.pos += 1;
                        Some(self.close(tree, too_deep)?)
                    } else if object {
                        self.member_name(tree, too_deep)?;
                        None
                    } else {
                        self.item_index(too_deep);
                        None
                    }
                }
                b'"' => Some(self.string(tree, too_deep)?),
                b'-' | b'0'..=b'9' => Some(self.number(tree, too_deep)?),
                b't' => Some(self.literal(b"true", tree, too_deep)?),
                b'f' => Some(self.literal(b"false", tree, too_deep)?),
                b'n' => Some(self.literal(b"null", tree, too_deep)?),
                _ => return Err(Failure::NotJson),
            };
            // A value ended: place it, then go on with its container.
            while let Some(value) = done.take() {
                if self.depth() == 0 {
                    return Ok((!too_deep).then_some(value));
                }
                self.place(value, too_deep);
                self.skip_whitespace();
                let object = self.in_object();
                match self.peek() {
                    Some(b',') => {
                        self.pos += 1;
                        if object {
                            self.member_name(tree, too_deep)?;
                        } else {
                            self.item_index(too_deep);
                        }
                    }
                    Some(b']') if !object => {
                        self.pos += 1;
                        done = Some(self.close(tree, too_deep)?);
                    }
                    Some(b'}') if object => {
                        self.pos += 1;
                        done = Some(self.close(tree, too_deep)?);
                    }
                    _ => return Err(Failure::NotJson),
                }
            }
        }
    }

    /// Puts a finished value into the innermost open container.
    fn place(&mut self, value: NodeId, too_deep: bool) {
        if too_deep || !self.deep.is_empty() {
            return;
        }
        let Some(frame) = self.frames.last_mut() else {
            return;
        };
        let value = if std::mem::take(&mut frame.skip_next) {
            SKIPPED
        } else {
            value
        };
        if frame.object {
            if let Some(name) = frame.name.take() {
                frame.members.push(Member { name, value });
            }
        } else {
            frame.items.push(value);
        }
    }

    /// Closes the innermost container and returns its node.
    fn close(&mut self, tree: &mut Tree, too_deep: bool) -> Result<NodeId, Failure> {
        if self.deep.pop().is_some() {
            return Ok(SKIPPED);
        }
        let Some(frame) = self.frames.pop() else {
            return Err(Failure::NotJson);
        };
        if too_deep {
            return Ok(SKIPPED);
        }
        if frame.object {
            let mut members = frame.members;
            let body = self.body;
            let mut compared = 0u64;
            members.sort_unstable_by(|a, b| {
                compared += 1;
                tree.name(body, &a.name).cmp(tree.name(body, &b.name))
            });
            tree.work += compared + members.len() as u64;
            if let Some(pair) = members
                .windows(2)
                .find(|w| tree.name(body, &w[0].name) == tree.name(body, &w[1].name))
            {
                let key = String::from_utf8_lossy(tree.name(body, &pair[0].name))
                    .chars()
                    .take(64)
                    .collect();
                return Err(Failure::Refused(BodyError::DuplicateKey { key }));
            }
            let start = tree.members.len();
            tree.members.extend(members);
            Ok(tree.push(Node::Object(start..tree.members.len())))
        } else {
            let start = tree.items.len();
            tree.work += frame.items.len() as u64;
            tree.items.extend(frame.items);
            Ok(tree.push(Node::Array(start..tree.items.len())))
        }
    }

    /// Reads `"name":` inside an object and decides whether its value is
    /// ignored.
    fn member_name(&mut self, tree: &mut Tree, too_deep: bool) -> Result<(), Failure> {
        self.skip_whitespace();
        if self.peek() != Some(b'"') {
            return Err(Failure::NotJson);
        }
        let name = self.decode_string(tree, !too_deep)?;
        self.eat(b':')?;
        if too_deep || !self.deep.is_empty() {
            return Ok(());
        }
        let name = name.unwrap_or(Name::Source(0..0));
        let body = self.body;
        let depth = self.frames.len() - 1;
        if let Some(frame) = self.frames.last_mut() {
            let token = tree.name(body, &name);
            let (skip, next) = follow(self.pointers, &frame.live, depth, token);
            frame.skip_next = skip;
            self.next_live = next;
            frame.name = Some(name);
        }
        Ok(())
    }

    /// Starts the next item of an array and decides whether it is ignored.
    fn item_index(&mut self, too_deep: bool) {
        if too_deep || !self.deep.is_empty() {
            return;
        }
        let depth = self.frames.len() - 1;
        if let Some(frame) = self.frames.last_mut() {
            let index = frame.index;
            frame.index += 1;
            let (skip, next) = if frame.live.is_empty() {
                (false, Vec::new())
            } else {
                let token = index.to_string();
                follow(self.pointers, &frame.live, depth, token.as_bytes())
            };
            frame.skip_next = skip;
            self.next_live = next;
        }
    }

    fn literal(&mut self, word: &[u8], tree: &mut Tree, skip: bool) -> Result<NodeId, Failure> {
        let start = self.pos;
        if !self.body[start..].starts_with(word) {
            return Err(Failure::NotJson);
        }
        self.pos += word.len();
        Ok(if skip {
            SKIPPED
        } else {
            tree.push(Node::Source(start..self.pos))
        })
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`, kept as
    /// written.
    fn number(&mut self, tree: &mut Tree, skip: bool) -> Result<NodeId, Failure> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if matches!(self.peek(), Some(b'0'..=b'9')) {
                    return Err(Failure::NotJson);
                }
            }
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(Failure::NotJson),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            self.at_least_one_digit()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            self.at_least_one_digit()?;
        }
        Ok(if skip {
            SKIPPED
        } else {
            tree.push(Node::Source(start..self.pos))
        })
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }

    fn at_least_one_digit(&mut self) -> Result<(), Failure> {
        if !matches!(self.peek(), Some(b'0'..=b'9')) {
            return Err(Failure::NotJson);
        }
        self.digits();
        Ok(())
    }

    /// A string value: its canonical text is its own bytes when it has no
    /// escapes, else the decoded text written the canonical way.
    fn string(&mut self, tree: &mut Tree, skip: bool) -> Result<NodeId, Failure> {
        let start = self.pos;
        let name = self.decode_string(tree, false)?;
        if skip {
            return Ok(SKIPPED);
        }
        Ok(match name {
            None => tree.push(Node::Source(start..self.pos)),
            Some(_) => {
                let from = tree.text.len();
                write_string(&self.scratch, &mut tree.text);
                tree.push(Node::Text(from..tree.text.len()))
            }
        })
    }

    /// Reads a string at `"`. Without escapes, returns `None` (the caller
    /// uses the body's bytes) or, with `keep_name`, its range in the body.
    /// With escapes, the decoded text is left in `scratch`, and with
    /// `keep_name` also copied to [`Tree::text`].
    fn decode_string(&mut self, tree: &mut Tree, keep_name: bool) -> Result<Option<Name>, Failure> {
        self.pos += 1;
        let start = self.pos;
        // The common case: no escape before the closing quote.
        loop {
            match self.peek().ok_or(Failure::NotJson)? {
                b'"' => {
                    let range = start..self.pos;
                    self.pos += 1;
                    return Ok(keep_name.then_some(Name::Source(range)));
                }
                b'\\' => break,
                0..=0x1f => return Err(Failure::NotJson),
                _ => self.pos += 1,
            }
        }
        self.scratch.clear();
        self.scratch.push_str(as_str(&self.body[start..self.pos]));
        loop {
            let at = self.pos;
            match self.peek().ok_or(Failure::NotJson)? {
                b'"' => {
                    self.pos += 1;
                    break;
                }
                b'\\' => {
                    self.pos += 1;
                    let decoded = self.escape()?;
                    self.scratch.push(decoded);
                }
                0..=0x1f => return Err(Failure::NotJson),
                _ => {
                    // Copy the run up to the next quote, escape or control.
                    let mut end = at + 1;
                    while let Some(&b) = self.body.get(end) {
                        if b == b'"' || b == b'\\' || b < 0x20 {
                            break;
                        }
                        end += 1;
                    }
                    self.scratch.push_str(as_str(&self.body[at..end]));
                    self.pos = end;
                }
            }
        }
        if keep_name {
            let from = tree.text.len();
            tree.text.extend_from_slice(self.scratch.as_bytes());
            Ok(Some(Name::Text(from..tree.text.len())))
        } else {
            Ok(Some(Name::Text(0..0)))
        }
    }

    /// One escape after `\`; a surrogate pair decodes to one character, an
    /// unpaired surrogate has no canonical text.
    fn escape(&mut self) -> Result<char, Failure> {
        let byte = self.peek().ok_or(Failure::NotJson)?;
        self.pos += 1;
        Ok(match byte {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let first = self.hex4()?;
                let code = match first {
                    0xD800..=0xDBFF => {
                        if self.body.get(self.pos..self.pos + 2) != Some(b"\\u") {
                            return Err(Failure::NotJson);
                        }
                        self.pos += 2;
                        let second = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&second) {
                            return Err(Failure::NotJson);
                        }
                        0x1_0000 + ((first - 0xD800) << 10) + (second - 0xDC00)
                    }
                    0xDC00..=0xDFFF => return Err(Failure::NotJson),
                    _ => first,
                };
                char::from_u32(code).ok_or(Failure::NotJson)?
            }
            _ => return Err(Failure::NotJson),
        })
    }

    fn hex4(&mut self) -> Result<u32, Failure> {
        let digits = self
            .body
            .get(self.pos..self.pos + 4)
            .ok_or(Failure::NotJson)?;
        let mut n = 0;
        for &d in digits {
            let v = (d as char).to_digit(16).ok_or(Failure::NotJson)?;
            n = n * 16 + v;
        }
        self.pos += 4;
        Ok(n)
    }
}

/// The ignored pointers among `live` whose token at `depth` is `token`:
/// whether the value there is ignored, and the pointers that go deeper.
fn follow(pointers: &Pointers, live: &[usize], depth: usize, token: &[u8]) -> (bool, Vec<usize>) {
    let mut skip = false;
    let mut next = Vec::new();
    for &p in live {
        let tokens = &pointers.0[p];
        if tokens.get(depth).is_some_and(|t| t.as_bytes() == token) {
            if tokens.len() == depth + 1 {
                skip = true;
            } else {
                next.push(p);
            }
        }
    }
    (skip, next)
}

/// `bytes` lies within a body already checked to be UTF-8 and is cut at
/// ASCII bytes only, so it is always valid; an empty string otherwise.
fn as_str(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or_default()
}

/// A string in the canonical escaping (`serde_json`'s: `"`, `\` and
/// control characters escaped, everything else as UTF-8).
pub(super) fn write_string(s: &str, out: &mut Vec<u8>) {
    // Serializing a string into a Vec cannot fail.
    if serde_json::to_writer(&mut *out, s).is_err() {
        out.extend_from_slice(b"\"\"");
    }
}
