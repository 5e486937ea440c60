//! Samples of durations, their percentiles, and the lines that show them.

use std::fmt;
use std::time::Duration;

/// The durations of one measured operation.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    durations: Vec<Duration>,
}

impl Samples {
    pub fn with_capacity(n: usize) -> Samples {
        Samples {
            durations: Vec::with_capacity(n),
        }
    }

    pub fn push(&mut self, d: Duration) {
        self.durations.push(d);
    }

    pub fn len(&self) -> usize {
        self.durations.len()
    }

    pub fn is_empty(&self) -> bool {
        self.durations.is_empty()
    }

    /// The `p`-th percentile (nearest rank); zero without samples.
    pub fn percentile(&self, p: u32) -> Duration {
        let mut sorted = self.durations.clone();
        sorted.sort_unstable();
        if sorted.is_empty() {
            return Duration::ZERO;
        }
        let n = sorted.len();
        // Nearest rank: the smallest sample with at least p% of the samples
        // at or below it.
        let rank = (n * p as usize).div_ceil(100).clamp(1, n);
        sorted[rank - 1]
    }

    pub fn p50(&self) -> Duration {
        self.percentile(50)
    }

    pub fn p90(&self) -> Duration {
        self.percentile(90)
    }
}

/// Milliseconds with two decimals.
#[derive(Debug, Clone, Copy)]
pub struct Ms(pub Duration);

impl fmt::Display for Ms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = format!("{:.2} ms", self.0.as_secs_f64() * 1000.0);
        f.pad(&text)
    }
}

/// `a / b` of two durations (p50 over p50).
pub fn ratio(a: Duration, b: Duration) -> f64 {
    if b.is_zero() {
        f64::INFINITY
    } else {
        a.as_secs_f64() / b.as_secs_f64()
    }
}

/// One row of a table: a label, then p50 and p90.
pub fn row(label: &str, s: &Samples) -> String {
    format!(
        "  {label:<44} {:>10} {:>10}   (n={})",
        Ms(s.p50()),
        Ms(s.p90()),
        s.len()
    )
}

/// The header of a table of [`row`]s.
pub fn header() -> String {
    format!("  {:<44} {:>10} {:>10}", "", "p50", "p90")
}

/// `met` or `MISSED`.
pub fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(values: &[u64]) -> Samples {
        let mut s = Samples::default();
        for v in values {
            s.push(Duration::from_millis(*v));
        }
        s
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let s = ms(&[5, 1, 4, 2, 3, 10, 9, 8, 7, 6]);
        assert_eq!(s.p50(), Duration::from_millis(5));
        assert_eq!(s.p90(), Duration::from_millis(9));
        assert_eq!(s.percentile(100), Duration::from_millis(10));
        assert_eq!(ms(&[7]).p90(), Duration::from_millis(7));
        assert_eq!(Samples::default().p50(), Duration::ZERO);
    }

    #[test]
    fn ratios_and_milliseconds_read_well() {
        assert!((ratio(Duration::from_millis(35), Duration::from_millis(50)) - 0.7).abs() < 1e-9);
        assert_eq!(
            ratio(Duration::from_millis(1), Duration::ZERO),
            f64::INFINITY
        );
        assert_eq!(Ms(Duration::from_micros(1500)).to_string(), "1.50 ms");
    }
}
