//! AFL++ harness of the `key` target: `scripts/fuzz.sh key MINUTES`.

fn main() {
    afl::fuzz!(|data: &[u8]| idemgate_fuzz::key(data));
}
