//! The hit-ratio alert as the dashboard shows it: how far the ratio is from
//! the level at which `IdempotencyHitRatioSurge` fires.
//!
//! The numbers come from the deployed rule, not from a second copy: when
//! `alert_rules` names the rules file, its `IdempotencyHitRatioSurge`
//! expression is read (`ratio > FACTOR * clamp_min(baseline, FLOOR) and
//! requests > MIN_RATE`), so an operator who tunes the rule sees the tuned
//! threshold. Without the file, or when the expression has another shape,
//! the shipped rule's numbers apply (a test reads them from
//! `ops/alerts.yml`), and the dashboard says which it uses.

use std::path::Path;

/// The alert the dashboard mirrors.
pub(crate) const ALERT: &str = "IdempotencyHitRatioSurge";

/// The numbers of the hit-ratio alert rule.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct HitRatioRule {
    /// The ratio fires at `factor` × its baseline…
    pub(crate) factor: f64,
    /// …the baseline counted as at least `floor`…
    pub(crate) floor: f64,
    /// …with more than `min_rate` keyed requests per second.
    pub(crate) min_rate: f64,
    /// Where the numbers come from: the rules file's path, or `shipped`.
    pub(crate) source: String,
}

impl HitRatioRule {
    /// The rule `ops/alerts.yml` ships.
    pub(crate) fn shipped() -> Self {
        Self {
            factor: 2.0,
            floor: 0.01,
            min_rate: 0.1,
            source: "shipped".to_owned(),
        }
    }

    /// The rule in the configured rules file, or the shipped one.
    pub(crate) fn configured(path: Option<&Path>) -> Self {
        let Some(path) = path else {
            return Self::shipped();
        };
        match std::fs::read_to_string(path) {
            Ok(text) => Self::from_rules_text(&text)
                .map(|(factor, floor, min_rate)| Self {
                    factor,
                    floor,
                    min_rate,
                    source: path.display().to_string(),
                })
                .unwrap_or_else(|| {
                    tracing::warn!(path = %path.display(), "the {ALERT} expression was not recognised; the dashboard shows the shipped rule's threshold");
                    Self::shipped()
                }),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "alert rules unreadable; the dashboard shows the shipped rule's threshold");
                Self::shipped()
            }
        }
    }

    /// `(factor, floor, min_rate)` of the `IdempotencyHitRatioSurge` rule in
    /// a Prometheus rules file, when its expression has the shipped shape.
    pub(crate) fn from_rules_text(text: &str) -> Option<(f64, f64, f64)> {
        let expr = alert_expr(text, ALERT)?;
        let expr: String = expr.split_whitespace().collect::<Vec<_>>().join(" ");
        let (_, rest) = expr.split_once("idemgate:hit_ratio:rate5m > ")?;
        let (factor, rest) = rest.split_once(" * clamp_min(idemgate:hit_ratio:baseline1h,")?;
        let (floor, rest) = rest.split_once(')')?;
        let (_, min_rate) = rest.split_once("idemgate:requests:rate5m > ")?;
        let min_rate = min_rate.split_whitespace().next()?;
        let number = |s: &str| s.trim().parse::<f64>().ok().filter(|v| v.is_finite());
        Some((number(factor)?, number(floor)?, number(min_rate)?))
    }

    /// The ratio at which the alert fires, given the baseline.
    pub(crate) fn threshold(&self, baseline: f64) -> f64 {
        self.factor * baseline.max(self.floor)
    }
}

/// The `expr` of alert `name` (a plain or block scalar), read line by line.
fn alert_expr(text: &str, name: &str) -> Option<String> {
    let mut lines = text.lines().skip_while(|l| {
        let l = l.trim_start().trim_start_matches('-').trim_start();
        l.strip_prefix("alert:")
            .is_none_or(|n| n.split('#').next().unwrap_or_default().trim() != name)
    });
    lines.next()?;
    let mut expr = String::new();
    let mut block_indent = None;
    for line in lines {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some(min) = block_indent {
            if !trimmed.is_empty() && indent < min {
                break;
            }
            expr.push(' ');
            expr.push_str(trimmed);
            continue;
        }
        if trimmed
            .trim_start_matches('-')
            .trim_start()
            .starts_with("alert:")
        {
            return None;
        }
        if let Some(v) = trimmed.strip_prefix("expr:") {
            let v = v.trim();
            if v.starts_with('|') || v.starts_with('>') {
                block_indent = Some(indent + 1);
            } else {
                return Some(v.to_owned());
            }
        }
    }
    (!expr.trim().is_empty()).then_some(expr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_rule_file_holds_the_shipped_numbers() {
        let text = include_str!("../../../../ops/alerts.yml");
        let (factor, floor, min_rate) =
            HitRatioRule::from_rules_text(text).expect("the shipped expression is recognised");
        let shipped = HitRatioRule::shipped();
        assert_eq!(
            (factor, floor, min_rate),
            (shipped.factor, shipped.floor, shipped.min_rate)
        );
    }

    #[test]
    fn a_tuned_rule_is_read_and_another_shape_is_not() {
        let tuned = "groups:\n  - name: a\n    rules:\n      - alert: IdempotencyInflightConflictSurge\n        expr: x > 3\n      - alert: IdempotencyHitRatioSurge\n        expr: idemgate:hit_ratio:rate5m >   1.5 * clamp_min(idemgate:hit_ratio:baseline1h, 0.02) and idemgate:requests:rate5m > 1\n        for: 5m\n";
        assert_eq!(HitRatioRule::from_rules_text(tuned), Some((1.5, 0.02, 1.0)));
        let other = "      - alert: IdempotencyHitRatioSurge\n        expr: |\n          idemgate:hit_ratio:rate5m > 0.5\n        for: 5m\n";
        assert_eq!(HitRatioRule::from_rules_text(other), None);
        assert_eq!(HitRatioRule::from_rules_text("groups: []\n"), None);
        let rule = HitRatioRule::shipped();
        assert!((rule.threshold(0.0) - 0.02).abs() < 1e-12, "the floor");
        assert!((rule.threshold(0.2) - 0.4).abs() < 1e-12);
    }

    #[test]
    fn a_missing_or_unrecognised_file_falls_back_to_the_shipped_rule() {
        assert_eq!(HitRatioRule::configured(None), HitRatioRule::shipped());
        let dir = tempfile::tempdir().expect("a temp dir");
        let missing = dir.path().join("none.yml");
        assert_eq!(
            HitRatioRule::configured(Some(&missing)),
            HitRatioRule::shipped()
        );
        let tuned = dir.path().join("alerts.yml");
        std::fs::write(
            &tuned,
            include_str!("../../../../ops/alerts.yml")
                .replace("> 2 * clamp_min", "> 3 * clamp_min"),
        )
        .expect("write");
        let rule = HitRatioRule::configured(Some(&tuned));
        assert_eq!(rule.factor, 3.0);
        assert_eq!(rule.source, tuned.display().to_string());
    }
}
