//! Placeholder; the credits example follows with the service.
fn main() {}
