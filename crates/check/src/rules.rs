//! The checklist's rules: one plain function per deployment mistake, each
//! adding its findings for a route (or the whole plan) to `out`.

use std::time::Duration;

use crate::*;

/// The hit ratio rises minutes before the error rate; without an
/// alert on it, nobody looks until the error rate has already moved.
pub(crate) fn alert_rules(rules: &AlertRules, out: &mut Vec<Finding>) {
    let message = match rules {
        AlertRules::Deployed => return,
        AlertRules::NotConfigured => {
            "no alert rules for the idempotency hit ratio and in-flight conflicts (`alert_rules` is not set)".to_owned()
        }
        AlertRules::Unreadable { path, reason } => {
            format!("the alert rules file {path} cannot be read ({reason})")
        }
        AlertRules::Incomplete { path, missing } => format!(
            "the alert rules file {path} does not define {}",
            missing.join(" or ")
        ),
    };
    out.push(Finding {
        rule: "alert-rules-missing",
        severity: Severity::Warning,
        route: None,
        message,
        fix: "deploy ops/alerts.yml to Prometheus and point `alert_rules` at it; the hit ratio rises minutes before the error rate".into(),
    });
}

pub(crate) fn finding(
    rule: &'static str,
    severity: Severity,
    route: &RoutePlan,
    message: String,
    fix: String,
) -> Finding {
    Finding {
        rule,
        severity,
        route: Some(route.name.clone()),
        message,
        fix,
    }
}

/// A duration as a person writes it: `0.5s`, `30s`, `14m 12s`, `1h 3s`,
/// `24h`. Exact to the tenth of a second, so a figure the fix asks for is
/// never shown rounded down.
pub(crate) fn secs(d: Duration) -> String {
    let tenths = d.as_millis().div_ceil(100);
    let (h, rest) = (tenths / 36_000, tenths % 36_000);
    let (m, t) = (rest / 600, rest % 600);
    let s = if t % 10 == 0 {
        format!("{}s", t / 10)
    } else {
        format!("{}.{}s", t / 10, t % 10)
    };
    let mut parts = Vec::new();
    if h > 0 {
        parts.push(format!("{h}h"));
    }
    if m > 0 {
        parts.push(format!("{m}m"));
    }
    if t > 0 || parts.is_empty() {
        parts.push(s);
    }
    parts.join(" ")
}

/// The record must outlive the longest retry path, twice.
pub(crate) fn done_ttl_covers_retry_window(r: &RoutePlan, out: &mut Vec<Finding>) {
    if let Err(e) = check_done_ttl(r.done_ttl, &r.client_retry) {
        out.push(finding(
            "done-ttl-short",
            Severity::Error,
            r,
            format!(
                "done_ttl {} is shorter than 2 x the longest retry window {} ({} attempts x {} timeout + backoff + {} compensation)",
                secs(e.done_ttl),
                secs(e.window),
                r.client_retry.attempts,
                secs(r.client_retry.attempt_timeout),
                secs(r.client_retry.compensation_delay)
            ),
            format!("set done_ttl to at least {}", secs(e.needed)),
        ));
    }
}

/// The total timeout must cover the longest legitimate generation,
/// or every long answer is paid for and then thrown away.
/// A JSON response's headers come when the generation is over, so on a
/// route that answers JSON the first-byte timeout bounds the whole
/// generation: shorter than the longest one, it cuts every long generation
/// after the upstream has started (and billed) it. The outcome is then
/// unknown: released for a paid retry, or kept as a 504 on a charging route.
pub(crate) fn first_byte_covers_generation(r: &RoutePlan, out: &mut Vec<Finding>) {
    let Some(g) = r.longest_generation else {
        return;
    };
    if r.streaming || r.first_byte_timeout >= g {
        return;
    }
    out.push(finding(
        "first-byte-timeout-short",
        Severity::Error,
        r,
        format!(
            "first_byte timeout {} is shorter than the longest expected generation {} on a route that answers JSON: its response headers come only when the generation ends, so every long generation is cut mid-way with its outcome unknown",
            secs(r.first_byte_timeout),
            secs(g)
        ),
        format!(
            "raise timeouts.first_byte above {} (or set `streaming = true` if the route only serves event streams)",
            secs(g)
        ),
    ));
}

pub(crate) fn total_timeout_covers_generation(r: &RoutePlan, out: &mut Vec<Finding>) {
    match r.longest_generation {
        Some(g) if r.total_timeout < g => out.push(finding(
            "total-timeout-short",
            Severity::Error,
            r,
            format!(
                "total_timeout {} is shorter than the longest expected generation {}: long answers are billed, then cut off and retried",
                secs(r.total_timeout),
                secs(g)
            ),
            format!("raise total_timeout above {}", secs(g)),
        )),
        Some(_) => {}
        None => out.push(finding(
            "longest-generation-unknown",
            Severity::Info,
            r,
            "the longest expected generation is not declared, so total_timeout cannot be checked".into(),
            "set longest_generation for the route".into(),
        )),
    }
    let generation = r.longest_generation.unwrap_or_default();
    if r.client_retry.attempt_timeout < generation {
        out.push(finding(
            "client-timeout-short",
            Severity::Warning,
            r,
            format!(
                "the client's timeout {} is shorter than the longest generation {}: every long request times out and retries (the gateway replays it, but the user waits)",
                secs(r.client_retry.attempt_timeout),
                secs(generation)
            ),
            "raise the client timeout, or stream the response".into(),
        ));
    }
}

/// A lease without a heartbeat must outlast the whole operation; with a
/// heartbeat it must survive a few missed beats.
pub(crate) fn pending_ttl_vs_operation(r: &RoutePlan, out: &mut Vec<Finding>) {
    match r.heartbeat {
        None if r.pending_ttl < r.total_timeout => out.push(finding(
            "pending-ttl-short",
            Severity::Error,
            r,
            format!(
                "pending_ttl {} without heartbeat is shorter than the operation (total_timeout {}): a slow run loses its lease and a retry runs it again",
                secs(r.pending_ttl),
                secs(r.total_timeout)
            ),
            format!("enable the heartbeat, or set pending_ttl above {}", secs(r.total_timeout)),
        )),
        Some(beat) if beat.saturating_mul(2) > r.pending_ttl => out.push(finding(
            "heartbeat-slow",
            Severity::Warning,
            r,
            format!(
                "heartbeat every {} leaves less than two beats inside pending_ttl {}",
                secs(beat),
                secs(r.pending_ttl)
            ),
            "renew at most every pending_ttl / 3".into(),
        )),
        _ => {}
    }
}

/// Connect short, first byte medium, total long: each timeout catches a
/// different failure, and a later one cannot fire before an earlier one.
pub(crate) fn timeouts_are_layered(r: &RoutePlan, out: &mut Vec<Finding>) {
    if !(r.connect_timeout <= r.first_byte_timeout && r.first_byte_timeout <= r.total_timeout) {
        out.push(finding(
            "timeouts-not-layered",
            Severity::Warning,
            r,
            format!(
                "timeouts should grow connect ≤ first byte ≤ total; got {} / {} / {}",
                secs(r.connect_timeout),
                secs(r.first_byte_timeout),
                secs(r.total_timeout)
            ),
            "connect in seconds, first byte for queueing, total for the longest generation".into(),
        ));
    }
}

/// A content hash alone merges two legitimate identical questions;
/// a derived key without a window merges them until done_ttl.
pub(crate) fn key_template(r: &RoutePlan, out: &mut Vec<Finding>) {
    let KeyPlan::Derive(parts) = &r.key else {
        return;
    };
    let has_body = parts.contains(&KeyPart::BodyHash);
    let has_person = parts.iter().any(|p| matches!(p, KeyPart::Header(_)));
    if has_body && !has_person {
        out.push(finding(
            "content-hash-only-key",
            Severity::Error,
            r,
            "the derived key is a content hash without a user or session: two users (or one user asking twice) get one answer".into(),
            "add the user and session headers to the template (user + session + body hash + window)".into(),
        ));
    }
    if !parts.iter().any(|p| matches!(p, KeyPart::Window(_))) {
        out.push(finding(
            "key-without-window",
            Severity::Warning,
            r,
            format!(
                "the derived key has no time window: the same request is merged for the whole done_ttl ({})",
                secs(r.done_ttl)
            ),
            "add a window (e.g. 10m) to the template".into(),
        ));
    }
    if !has_body && !has_person {
        out.push(finding(
            "key-too-coarse",
            Severity::Error,
            r,
            "the derived key names neither the user nor the request: unrelated operations share one key".into(),
            "include a user/session header and the body hash".into(),
        ));
    }
}

/// A configured key file the gateway cannot load stops `serve`; say so
/// before the deploy does.
pub(crate) fn key_file(encryption: &Encryption, out: &mut Vec<Finding>) {
    if let Encryption::Unreadable { path, reason } = encryption {
        out.push(Finding {
            rule: "encryption-key-file-unreadable",
            severity: Severity::Error,
            route: None,
            message: format!("the encryption key file {path} cannot be used ({reason})"),
            fix: "fix the file (`idemgate keys generate-encryption-key` prints a line) or unset `encryption_key_file`".into(),
        });
    }
}

/// Stored answers are as sensitive as the prompts: without a key ring,
/// anyone who reads the store (or a backup) reads them. On a charging
/// route the stored answer is also what decides whether a charge repeats,
/// so it must not be alterable unnoticed either.
pub(crate) fn encryption_at_rest(encryption: &Encryption, r: &RoutePlan, out: &mut Vec<Finding>) {
    if *encryption != Encryption::NotConfigured {
        return;
    }
    let severity = if r.charges {
        Severity::Error
    } else {
        Severity::Warning
    };
    out.push(finding(
        "responses-unencrypted",
        severity,
        r,
        "stored responses are kept unencrypted: whoever reads the store or a backup reads every answer, and can alter it unnoticed".into(),
        "set `encryption_key_file` (or --encryption-key-file); `idemgate keys generate-encryption-key` prints a key line".into(),
    ));
}

/// A store guarding charges must not lose data.
pub(crate) fn store_for_charges(store: StoreKind, r: &RoutePlan, out: &mut Vec<Finding>) {
    if !r.charges {
        return;
    }
    if store == StoreKind::Memory {
        out.push(finding(
            "memory-store-charges",
            Severity::Error,
            r,
            "a charging route uses the in-memory store: a restart forgets every key and the next retry charges again".into(),
            "use sqlite (one machine), postgres or redis with persistence".into(),
        ));
    }
    if r.fail_open {
        out.push(finding(
            "fail-open-charges",
            Severity::Error,
            r,
            "a charging route forwards requests unprotected when the store fails (fail_open)"
                .into(),
            "use on_store_error = \"fail_closed\" on charging routes".into(),
        ));
    }
}

/// A charging route that accepts requests without a key protects only the
/// clients that remember to send one: a deploy that drops the header turns
/// protection off without an error anywhere.
pub(crate) fn charging_route_key_optional(r: &RoutePlan, out: &mut Vec<Finding>) {
    if r.charges && matches!(r.key, KeyPlan::Optional) {
        out.push(finding(
            "charging-route-key-optional",
            Severity::Warning,
            r,
            "a charging route forwards requests without an Idempotency-Key unprotected: a client that stops sending the header runs every retry again".into(),
            "use key = \"require\" (or \"derive\") on charging routes, and keep the IdempotencyUnkeyedOnChargingRoute alert".into(),
        ));
    }
}

/// 2xx and most 4xx are final outcomes; marking them retryable re-executes.
pub(crate) fn retryable_statuses(r: &RoutePlan, out: &mut Vec<Finding>) {
    let wrong: Vec<u16> = r
        .retryable_statuses
        .iter()
        .copied()
        .filter(|s| (200..300).contains(s) || ((400..500).contains(s) && *s != 408 && *s != 429))
        .collect();
    if !wrong.is_empty() {
        out.push(finding(
            "retryable-final-status",
            Severity::Warning,
            r,
            format!("statuses {wrong:?} are final outcomes but are configured as retryable: the work runs again on retry"),
            "keep retryable statuses to 408, 429 and 5xx".into(),
        ));
    }
}

/// Clients of a known provider authenticate with its credential header; a
/// tenant read from other headers puts all of them in one tenant (or in
/// `anonymous`), where one client's key replays another client's answer.
pub(crate) fn tenant_reads_credential(r: &RoutePlan, out: &mut Vec<Finding>) {
    let Some(header) = provider_credential_header(&r.upstream_host) else {
        return;
    };
    if r.tenant_headers
        .iter()
        .any(|h| h.eq_ignore_ascii_case(header))
    {
        return;
    }
    out.push(finding(
        "tenant-misses-credential",
        Severity::Warning,
        r,
        format!(
            "the upstream {} authenticates with the `{header}` header, but the tenant is read from [{}]: clients that send only `{header}` share one tenant and can receive each other's stored results",
            r.upstream_host,
            r.tenant_headers.join(", ")
        ),
        format!("add \"{header}\" to tenant_headers, or leave tenant_headers out to read the credential headers"),
    ));
}
