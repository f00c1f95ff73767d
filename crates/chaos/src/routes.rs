//! The gateway routes a run exercises: every `on_inflight` mode, each with
//! and without `charges`, all to the same upstream. A route's name is its
//! path prefix and its namespace.

/// The admin token every replica is configured with (forgets need it).
pub const ADMIN_TOKEN: &str = "chaos-admin";

/// One route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// Its name: the prefix `/{name}` and the route id.
    pub name: String,
    /// `on_inflight`: `wait`, `attach` or `reject`.
    pub on_inflight: &'static str,
    /// Whether the promise judged says it charges.
    pub charges: bool,
    /// `charges` as written in the gateway's configuration (differs from
    /// `charges` only in the broken mode that turns it off).
    pub charges_written: bool,
}

impl Route {
    /// The routes of a run: `wait`, `attach`, `reject`, each plain (`-p`)
    /// and charging (`-c`).
    pub fn all() -> Vec<Self> {
        let mut routes = Vec::new();
        for mode in ["wait", "attach", "reject"] {
            for charges in [false, true] {
                routes.push(Self {
                    name: format!("{mode}-{}", if charges { "c" } else { "p" }),
                    on_inflight: mode,
                    charges,
                    charges_written: charges,
                });
            }
        }
        routes
    }

    /// The route's `[[routes]]` table. Timeouts are short so that faults
    /// and cuts settle within a run: a stall past `idle`, a JSON answer
    /// past `first_byte`.
    pub fn toml(&self, upstream: &str, pending_ttl: &str) -> String {
        format!(
            r#"
[[routes]]
id = "{name}"
prefix = "/{name}"
strip_prefix = true
upstream = "{upstream}"
key = "require"
on_inflight = "{mode}"
inflight_wait = "5s"
pending_ttl = "{pending_ttl}"
charges = {charges}
timeouts = {{ connect = "1s", first_byte = "10s", idle = "5s", total = "15s" }}
"#,
            name = self.name,
            mode = self.on_inflight,
            charges = self.charges_written,
        )
    }
}
