//! The report a person reads: the story's setup, a side-by-side table of
//! what both runs counted, and what it means. Every figure and every claim
//! comes from the counts; nothing is written in advance.

use std::fmt::Write as _;
use std::time::Duration;

use crate::{DemoReport, RunStats};

/// Row labels of the table, also what tests look for.
pub(crate) mod rows {
    pub(crate) const OPERATIONS: &str = "operations";
    pub(crate) const ATTEMPTS: &str = "client attempts";
    pub(crate) const TIMEOUTS: &str = "client timeouts";
    pub(crate) const ANSWERED: &str = "operations answered";
    pub(crate) const REPLAYED: &str = "  answered from the store";
    pub(crate) const EXECUTIONS: &str = "LLM executions";
    pub(crate) const TOKENS: &str = "billed tokens";
    pub(crate) const CHARGES: &str = "charges made";
    pub(crate) const DUPLICATES: &str = "duplicate charges";
    pub(crate) const UNANSWERED: &str = "charged, never answered";
    pub(crate) const CLIENT_TIME: &str = "client time";
}

/// Width of the printed paragraphs.
const WIDTH: usize = 78;

/// `12,345`.
fn num(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "0%".to_owned()
    } else {
        format!("{:.0}%", part as f64 * 100.0 / whole as f64)
    }
}

/// Fills `text` to `width` columns; blank lines separate paragraphs.
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    for para in text.split("\n\n") {
        let mut line = String::new();
        for word in para.split_whitespace() {
            if !line.is_empty() && line.len() + 1 + word.len() > width {
                out.push_str(&line);
                out.push('\n');
                line.clear();
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
        if !line.is_empty() {
            out.push_str(&line);
            out.push('\n');
        }
        out.push('\n');
    }
    out
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", num(n), if n == 1 { one } else { many })
}

/// The printed report.
pub fn render(r: &DemoReport) -> String {
    let t = &r.timing;
    let (d, g) = (&r.direct, &r.idemgate);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "idemgate demo: the timeout-and-retry story, run on this machine\n"
    );
    let setup = format!(
        "A report service asks a slow LLM for a report ({}–{} per call), then charges \
         the account one credit. Its client gives up after {} and retries: {} attempts, \
         backoff {} doubling (capped at {}, full jitter), the same Idempotency-Key on \
         every attempt. {} operations at once, seed {}{}; the same workload twice.",
        secs(t.latency_min),
        secs(t.latency_max),
        secs(t.client_timeout),
        t.attempts,
        secs(t.backoff_base),
        secs(t.backoff_cap),
        r.options.operations,
        r.options.seed,
        if r.options.quick { ", --quick" } else { "" },
    );
    out.push_str(&wrap(&setup, WIDTH));
    let table: [(&str, String, String); 11] = [
        (
            rows::OPERATIONS,
            num(d.operations as u64),
            num(g.operations as u64),
        ),
        (rows::ATTEMPTS, num(d.attempts), num(g.attempts)),
        (rows::TIMEOUTS, num(d.timeouts), num(g.timeouts)),
        (
            rows::ANSWERED,
            num(d.answered as u64),
            num(g.answered as u64),
        ),
        (
            rows::REPLAYED,
            "-".to_owned(),
            num(g.replayed_answers as u64),
        ),
        (
            rows::EXECUTIONS,
            num(d.llm_executions),
            num(g.llm_executions),
        ),
        (rows::TOKENS, num(d.billed_tokens), num(g.billed_tokens)),
        (rows::CHARGES, num(d.charges), num(g.charges)),
        (
            rows::DUPLICATES,
            num(d.duplicate_charges),
            num(g.duplicate_charges),
        ),
        (
            rows::UNANSWERED,
            num(d.charged_unanswered as u64),
            num(g.charged_unanswered as u64),
        ),
        (rows::CLIENT_TIME, secs(d.client_time), secs(g.client_time)),
    ];
    let _ = writeln!(
        out,
        "  {:<26}{:>18}{:>16}",
        "", "without idemgate", "with idemgate"
    );
    for (label, without, with) in &table {
        let _ = writeln!(out, "  {label:<26}{without:>18}{with:>16}");
    }
    out.push('\n');

    let tokens_saved = d.billed_tokens.saturating_sub(g.billed_tokens);
    let charges_saved = d.charges.saturating_sub(g.charges);
    let saved = format!(
        "Saved by idemgate: {} billed tokens ({} of the unprotected bill) and {}.",
        num(tokens_saved),
        pct(tokens_saved, d.billed_tokens),
        plural(charges_saved, "charge", "charges"),
    );
    out.push_str(&wrap(&saved, WIDTH));
    out.push_str(&wrap(&explain_direct(d), WIDTH));
    out.push_str(&wrap(&explain_idemgate(g), WIDTH));
    let _ = writeln!(
        out,
        "Next: put the gateway in front of your own LLM API or service, point the\n\
         client's base_url at it and send Idempotency-Key:\n\
         \n\
         \x20 idemgate serve --upstream http://127.0.0.1:8000   # proxy on 127.0.0.1:8080\n\
         \x20 idemgate check --config idemgate.toml             # the pre-launch checklist\n\
         \x20 idemgate keys show KEY --store sqlite:idemgate.db # one key's timeline"
    );
    out
}

fn explain_direct(d: &RunStats) -> String {
    if d.timeouts == 0 {
        return "Without idemgate: no attempt timed out this time, so nothing ran twice; \
                try another --seed."
            .to_owned();
    }
    let mut s = format!(
        "Without idemgate: the client gave up {}, but the service kept working, as real \
         servers do: every attempt that reached it ran the model and charged the account. \
         {} LLM executions for {} operations; {} of the {} charges were duplicates",
        plural(d.timeouts, "time", "times"),
        num(d.llm_executions),
        num(d.operations as u64),
        num(d.duplicate_charges),
        num(d.charges),
    );
    if d.charged_unanswered > 0 {
        let _ = write!(
            s,
            ", and {} charged without ever getting an answer",
            plural(
                d.charged_unanswered as u64,
                "operation was",
                "operations were"
            ),
        );
    }
    s.push('.');
    s
}

fn explain_idemgate(g: &RunStats) -> String {
    let ops = g.operations as u64;
    let once = g.llm_executions == ops && g.charges == ops && g.duplicate_charges == 0;
    let mut s = String::from(
        "With idemgate (IdempotencyLayer over an SQLite store): the first attempt \
         claimed the key and its work ran to the end after the client left; retries \
         with the same key waited for that result or were answered from the store. ",
    );
    if once {
        let _ = write!(
            s,
            "Exactly one LLM execution and one charge per operation; {} of {} operations answered.",
            num(g.answered as u64),
            num(ops)
        );
    } else {
        let _ = write!(
            s,
            "This run counted {} LLM executions and {} for {} operations.",
            num(g.llm_executions),
            plural(g.charges, "charge", "charges"),
            num(ops)
        );
    }
    if g.timeouts > 0 {
        let _ = write!(
            s,
            "\n\nThe client still timed out {}: idemgate makes the retry safe, not the \
             model faster. A client timeout above the longest generation avoids the wait \
             (`idemgate check` compares them).",
            plural(g.timeouts, "time", "times"),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DemoOptions, Timing};

    #[test]
    fn numbers_group_thousands() {
        assert_eq!(num(0), "0");
        assert_eq!(num(999), "999");
        assert_eq!(num(1000), "1,000");
        assert_eq!(num(1_234_567), "1,234,567");
    }

    #[test]
    fn the_report_prints_the_counts_it_was_given() {
        let direct = RunStats {
            operations: 3,
            attempts: 7,
            timeouts: 5,
            answered: 2,
            llm_executions: 7,
            billed_tokens: 2_870,
            charges: 7,
            duplicate_charges: 4,
            charged_unanswered: 1,
            ..RunStats::default()
        };
        let idemgate = RunStats {
            operations: 3,
            attempts: 5,
            timeouts: 2,
            answered: 3,
            replayed_answers: 2,
            llm_executions: 3,
            billed_tokens: 1_230,
            charges: 3,
            ..RunStats::default()
        };
        let text = render(&DemoReport {
            options: DemoOptions::default(),
            timing: Timing::new(false),
            direct,
            idemgate,
            elapsed: Duration::from_secs(9),
        });
        let row = |label: &str| -> Vec<String> {
            text.lines()
                .find(|l| l.trim_start().starts_with(label.trim_start()))
                .map(|l| l.split_whitespace().map(str::to_owned).collect())
                .unwrap_or_default()
        };
        assert_eq!(row(rows::TOKENS).last().map(String::as_str), Some("1,230"));
        assert!(row(rows::TOKENS).contains(&"2,870".to_owned()));
        assert!(text.contains("Saved by idemgate: 1,640 billed tokens (57%"));
        assert!(text.contains("Exactly one LLM execution and one charge per operation"));
        assert!(text.contains("1 operation was charged without ever getting an answer"));
        assert!(text.lines().all(|l| l.chars().count() <= WIDTH), "{text}");
    }
}
