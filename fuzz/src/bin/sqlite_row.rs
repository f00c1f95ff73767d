//! AFL++ harness of the `sqlite_row` target: `scripts/fuzz.sh sqlite_row MINUTES`.

fn main() {
    afl::fuzz!(|data: &[u8]| idemgate_fuzz::sqlite_row(data));
}
