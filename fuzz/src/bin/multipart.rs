//! AFL++ harness of the `multipart` target: `scripts/fuzz.sh multipart MINUTES`.

fn main() {
    afl::fuzz!(|data: &[u8]| idemgate_fuzz::multipart(data));
}
