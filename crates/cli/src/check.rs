//! `idemgate check`: the pre-launch checklist (docs/design.md) over a
//! configuration, so a mistake that would cause duplicates or lost results
//! (a short `done_ttl`, a merging key, a memory store on a charging route)
//! is found before launch.
//!
//! Exit status: 0 when no finding is an error, 1 when one is, 2 when the
//! configuration cannot be read or is invalid.

use std::process::ExitCode;

use clap::{Args, ValueEnum};
use idemgate_check::{Finding, Severity};
use idemgate_gateway::GatewayConfig;
use serde_json::json;

use crate::ConfigArgs;

/// Exit status when the configuration cannot be used at all.
const EXIT_INVALID: u8 = 2;

/// How long the store's server has to answer `check`'s question.
const STORE_QUESTION: std::time::Duration = std::time::Duration::from_secs(3);

/// Flags of `idemgate check`.
#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

/// How findings are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// For a person: one finding per block, then a summary line.
    Text,
    /// One JSON object: findings, counts, and whether the check passed.
    Json,
}

/// Runs the checklist and prints it; returns the exit status.
pub(crate) fn run(args: &CheckArgs) -> ExitCode {
    let config = match args.config.load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("idemgate check: invalid configuration: {e}");
            if args.format == Format::Json {
                println!(
                    "{}",
                    json!({ "error": e.to_string(), "field": e.field(), "passed": false })
                );
            }
            return ExitCode::from(EXIT_INVALID);
        }
    };
    let mut findings = idemgate_gateway::plan::findings(&config);
    // What only the store's server can tell (PostgreSQL's synchronous
    // standbys and autovacuum), asked within a few seconds.
    let asked = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map(|rt| {
            rt.block_on(idemgate_gateway::plan::store_findings(
                &config,
                STORE_QUESTION,
            ))
        });
    match asked {
        Ok(more) => findings.extend(more),
        Err(e) => eprintln!("idemgate check: the store was not asked: {e}"),
    }
    let source = match &args.config.config {
        Some(p) => p.display().to_string(),
        None => "no file (defaults, IDEMGATE_* and flags)".to_owned(),
    };
    match args.format {
        Format::Text => print!("{}", text(&source, &config, &findings)),
        Format::Json => println!("{}", as_json(&source, &config, &findings)),
    }
    if idemgate_check::has_errors(&findings) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

struct Counts {
    errors: usize,
    warnings: usize,
    infos: usize,
}

fn counts(findings: &[Finding]) -> Counts {
    let n = |s| findings.iter().filter(|f| f.severity == s).count();
    Counts {
        errors: n(Severity::Error),
        warnings: n(Severity::Warning),
        infos: n(Severity::Info),
    }
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

fn summary(findings: &[Finding]) -> String {
    let c = counts(findings);
    if findings.is_empty() {
        return "no findings: the configuration passes the pre-launch checklist".to_owned();
    }
    let tally = format!(
        "{}, {}, {}",
        plural(c.errors, "error"),
        plural(c.warnings, "warning"),
        plural(c.infos, "info")
    );
    if c.errors > 0 {
        format!("{tally}: duplicates or lost results will happen; fix the errors before launch")
    } else if c.warnings > 0 {
        format!("{tally}: passes, but read the warnings")
    } else {
        format!("{tally}: passes the pre-launch checklist")
    }
}

fn text(source: &str, config: &GatewayConfig, findings: &[Finding]) -> String {
    let routes: Vec<&str> = config.routes.iter().map(|r| r.id.as_str()).collect();
    let mut out = format!(
        "idemgate check: {source}\nstore {}, {} ({})\n\n",
        config.store.backend(),
        plural(routes.len(), "route"),
        routes.join(", ")
    );
    for f in findings {
        out.push_str(&f.to_string());
        out.push_str("\n\n");
    }
    out.push_str(&summary(findings));
    out.push('\n');
    out
}

fn as_json(source: &str, config: &GatewayConfig, findings: &[Finding]) -> serde_json::Value {
    let c = counts(findings);
    json!({
        "config": source,
        "store": config.store.backend(),
        "routes": config.routes.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        "findings": findings,
        "summary": { "errors": c.errors, "warnings": c.warnings, "infos": c.infos },
        "passed": !idemgate_check::has_errors(findings),
    })
}
