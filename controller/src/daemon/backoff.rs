//! Per-target retry delays: after a failure a target waits 800 ms, then
//! twice as long after each further failure, up to 30 s, each delay
//! jittered by ±20 % so that targets failing together do not retry in
//! lockstep. A success forgets the target's failures. Pure: the time is a
//! parameter.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use hermes_model::plan::Target;

pub const FIRST_DELAY: Duration = Duration::from_millis(800);
pub const MAX_DELAY: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy)]
struct Failing {
    failures: u32,
    retry_at: Instant,
}

/// The failing targets and when each may be tried again.
#[derive(Debug, Clone, Default)]
pub struct Backoff {
    failing: BTreeMap<Target, Failing>,
}

impl Backoff {
    /// The delay before the `n`th retry (n ≥ 1), before jitter.
    pub fn base_delay(failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(16);
        FIRST_DELAY.saturating_mul(1 << doublings).min(MAX_DELAY)
    }

    /// Records a failure of `target` at `now`; returns the delay chosen.
    pub fn failed(&mut self, target: &Target, now: Instant) -> Duration {
        let failures = self.failing.get(target).map_or(0, |f| f.failures) + 1;
        let base = Self::base_delay(failures);
        // ±20 %, from a per-process random hash of the target and attempt.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write(target.to_string().as_bytes());
        h.write_u32(failures);
        let spread = (h.finish() % 401) as f64 / 1000.0 - 0.2; // -0.2 ..= 0.2
        let delay = base.mul_f64(1.0 + spread).min(MAX_DELAY);
        self.failing.insert(
            target.clone(),
            Failing {
                failures,
                retry_at: now + delay,
            },
        );
        delay
    }

    /// Forgets the failures of `target`.
    pub fn succeeded(&mut self, target: &Target) {
        self.failing.remove(target);
    }

    /// When `target` may be tried again, if it must wait past `now`.
    pub fn waiting(&self, target: &Target, now: Instant) -> Option<Instant> {
        self.failing
            .get(target)
            .map(|f| f.retry_at)
            .filter(|at| *at > now)
    }

    /// The earliest moment a waiting target may be tried again.
    pub fn next_retry(&self, now: Instant) -> Option<Instant> {
        self.failing
            .values()
            .map(|f| f.retry_at)
            .filter(|at| *at > now)
            .min()
    }

    pub fn failures(&self, target: &Target) -> u32 {
        self.failing.get(target).map_or(0, |f| f.failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(task: &str) -> Target {
        Target::Sandbox {
            profile: "p".into(),
            task: task.into(),
            session: None,
        }
    }

    #[test]
    fn delays_double_from_800_ms_up_to_30_s() {
        let delays: Vec<u64> = (1..=8)
            .map(|n| Backoff::base_delay(n).as_millis() as u64)
            .collect();
        assert_eq!(delays, [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]);
        assert_eq!(Backoff::base_delay(1000), MAX_DELAY);
    }

    #[test]
    fn a_failing_target_waits_its_jittered_delay_and_a_success_resets_it() {
        let mut b = Backoff::default();
        let t = sandbox("a");
        let now = Instant::now();
        let first = b.failed(&t, now);
        assert!(
            first >= Duration::from_millis(640) && first <= Duration::from_millis(960),
            "{first:?}"
        );
        assert_eq!(b.waiting(&t, now), Some(now + first));
        assert_eq!(b.waiting(&t, now + first), None);
        assert_eq!(b.waiting(&sandbox("other"), now), None);
        let second = b.failed(&t, now);
        assert!(second >= Duration::from_millis(1280), "{second:?}");
        assert_eq!(b.failures(&t), 2);
        assert_eq!(b.next_retry(now), Some(now + second));
        b.succeeded(&t);
        assert_eq!(b.waiting(&t, now), None);
        assert_eq!(b.failures(&t), 0);
        assert_eq!(b.next_retry(now), None);
    }

    #[test]
    fn the_jitter_never_passes_the_cap() {
        let mut b = Backoff::default();
        let t = sandbox("a");
        let now = Instant::now();
        for _ in 0..20 {
            assert!(b.failed(&t, now) <= MAX_DELAY);
        }
    }
}
