//! AFL++ harness of the `digest` target: `scripts/fuzz.sh digest MINUTES`.

fn main() {
    afl::fuzz!(|data: &[u8]| idemgate_fuzz::digest(data));
}
