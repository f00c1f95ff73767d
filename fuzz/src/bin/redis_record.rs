//! AFL++ harness of the `redis_record` target: `scripts/fuzz.sh redis_record MINUTES`.

fn main() {
    afl::fuzz!(|data: &[u8]| idemgate_fuzz::redis_record(data));
}
