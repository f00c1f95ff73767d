//! AFL++ harness of the `headers` target: `scripts/fuzz.sh headers MINUTES`.

fn main() {
    afl::fuzz!(|data: &[u8]| idemgate_fuzz::headers(data));
}
