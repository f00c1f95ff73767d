//! A cursor over fuzz input: targets take the fields they need from the
//! front (a byte, a number, a short slice) and treat the rest as the
//! payload. Running out of input gives zeros and empty slices, never an
//! error, so every input drives the target somewhere.

/// Reads fields from the front of the input.
#[derive(Debug)]
pub(crate) struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    /// The next byte, 0 at the end.
    pub(crate) fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// The next `n` bytes (fewer at the end).
    pub(crate) fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        head
    }

    /// A slice whose length is the next byte.
    pub(crate) fn short(&mut self) -> &'a [u8] {
        let n = usize::from(self.byte());
        self.take(n)
    }

    /// A slice whose length is the next two bytes (big-endian).
    pub(crate) fn medium(&mut self) -> &'a [u8] {
        let n = usize::from(u16::from_be_bytes([self.byte(), self.byte()]));
        self.take(n)
    }

    /// The next eight bytes as a big-endian `i64` (zero-filled).
    pub(crate) fn i64(&mut self) -> i64 {
        let mut b = [0u8; 8];
        let got = self.take(8);
        b[..got.len()].copy_from_slice(got);
        i64::from_be_bytes(b)
    }

    /// Everything not read yet.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
}
