//! AFL++ harness of the `config` target: `scripts/fuzz.sh config MINUTES`.

fn main() {
    afl::fuzz!(|data: &[u8]| idemgate_fuzz::config(data));
}
