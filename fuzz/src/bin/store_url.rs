//! AFL++ harness of the `store_url` target: `scripts/fuzz.sh store_url MINUTES`.

fn main() {
    afl::fuzz!(|data: &[u8]| idemgate_fuzz::store_url(data));
}
