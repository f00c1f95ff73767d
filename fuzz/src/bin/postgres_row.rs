//! AFL++ harness of the `postgres_row` target: `scripts/fuzz.sh postgres_row MINUTES`.

fn main() {
    afl::fuzz!(|data: &[u8]| idemgate_fuzz::postgres_row(data));
}
