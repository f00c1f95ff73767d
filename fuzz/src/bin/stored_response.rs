//! AFL++ harness of the `stored_response` target: `scripts/fuzz.sh stored_response MINUTES`.

fn main() {
    afl::fuzz!(|data: &[u8]| idemgate_fuzz::stored_response(data));
}
