//! AFL++ harness of the `sealed` target: `scripts/fuzz.sh sealed MINUTES`.

fn main() {
    afl::fuzz!(|data: &[u8]| idemgate_fuzz::sealed(data));
}
