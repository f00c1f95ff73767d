//! AFL++ harness of the `sse` target: `scripts/fuzz.sh sse MINUTES`.

fn main() {
    afl::fuzz!(|data: &[u8]| idemgate_fuzz::sse(data));
}
