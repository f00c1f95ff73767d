//! The keys an operator looks at first, in this process: the most-retried
//! keys, the keys executing now, and the latest in-flight conflicts and
//! fenced completions. The dashboard lists them, and each row opens the
//! key's timeline.
//!
//! It exists beside the metrics because metrics never carry a key (labels
//! stay low-cardinality), while a person chasing a retry storm needs the
//! keys themselves. Memory is bounded: at most `capacity` keys are held;
//! when a new key comes and the table is full, the keys seen least recently
//! are forgotten (never one executing now), an eighth of the table at a
//! time: one pass over the table then makes room for many new keys, so a
//! stream of fresh keys costs O(1) each rather than a scan each. A key is held as its timeline
//! addresses it: the tenant id (a hash of the credential, never the
//! credential), the route and the client's key. Driven by an explicit
//! `now_ms`, so tests step time exactly.

use std::collections::HashMap;

use idemgate_engine::ScopedKey;

use crate::RequestOutcome;

/// What the table holds for one key.
#[derive(Debug, Clone, Default)]
struct Entry {
    requests: u32,
    conflicts: u32,
    fenced: u32,
    last_outcome: Option<RequestOutcome>,
    last_seen_ms: u64,
    last_conflict_ms: Option<u64>,
    last_fenced_ms: Option<u64>,
    /// Executions of this key running now in this process.
    running: u32,
    running_since_ms: u64,
}

/// One key as the dashboard lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecentKey {
    /// Tenant id, route (namespace) and client key.
    pub key: ScopedKey,
    /// Requests with this key since it was first held.
    pub requests: u32,
    /// Of those, how many met the key in flight.
    pub conflicts: u32,
    /// Completions of this key refused because its lease was taken over.
    pub fenced: u32,
    /// How the last request ended (none yet while the first one runs).
    pub last_outcome: Option<RequestOutcome>,
    /// When the key was last seen (wall clock, ms).
    pub last_seen_ms: u64,
    /// When the execution running now began, if one is.
    pub running_since_ms: Option<u64>,
    /// When a request last met the key in flight.
    pub last_conflict_ms: Option<u64>,
    /// When a completion of the key was last fenced.
    pub last_fenced_ms: Option<u64>,
}

/// The lists of [`RecentKeys::snapshot`], each at most `per_list` long.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RecentSnapshot {
    /// Keys held now.
    pub tracked: usize,
    /// The most keys ever held.
    pub capacity: usize,
    /// Keys executing now, longest running first.
    pub inflight: Vec<RecentKey>,
    /// Keys sent more than once, most requests first.
    pub most_retried: Vec<RecentKey>,
    /// Keys that met an in-flight execution, latest first.
    pub conflicts: Vec<RecentKey>,
    /// Keys with a fenced completion, latest first.
    pub fenced: Vec<RecentKey>,
}

/// The bounded table of recent keys.
#[derive(Debug)]
pub struct RecentKeys {
    capacity: usize,
    entries: HashMap<ScopedKey, Entry>,
}

impl RecentKeys {
    /// A table holding at most `capacity` keys.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: HashMap::new(),
        }
    }

    /// The entry of `key`, made (forgetting the least recently seen key
    /// not running, when full) if it is new; `None` when every held key
    /// is running and the table is full.
    fn entry(&mut self, key: &ScopedKey, now_ms: u64) -> Option<&mut Entry> {
        if !self.entries.contains_key(key) {
            if self.entries.len() >= self.capacity {
                self.forget_oldest();
                if self.entries.len() >= self.capacity {
                    return None;
                }
            }
            self.entries.insert(key.clone(), Entry::default());
        }
        let e = self.entries.get_mut(key)?;
        e.last_seen_ms = e.last_seen_ms.max(now_ms);
        Some(e)
    }

    /// Forgets the least recently seen keys not running now: an eighth of
    /// the capacity (at least one), or fewer when the rest are running.
    fn forget_oldest(&mut self) {
        let batch = (self.capacity / 8).max(1);
        let mut idle: Vec<(u64, &ScopedKey)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.running == 0)
            .map(|(k, e)| (e.last_seen_ms, k))
            .collect();
        if idle.len() > batch {
            idle.select_nth_unstable_by_key(batch - 1, |(seen, _)| *seen);
            idle.truncate(batch);
        }
        let oldest: Vec<ScopedKey> = idle.into_iter().map(|(_, k)| k.clone()).collect();
        for k in &oldest {
            self.entries.remove(k);
        }
    }

    /// A request with `key` ended with `outcome`.
    pub fn request(&mut self, key: &ScopedKey, outcome: RequestOutcome, now_ms: u64) {
        if let Some(e) = self.entry(key, now_ms) {
            e.requests = e.requests.saturating_add(1);
            e.last_outcome = Some(outcome);
            if outcome == RequestOutcome::Fenced {
                e.fenced = e.fenced.saturating_add(1);
                e.last_fenced_ms = Some(now_ms);
            }
        }
    }

    /// A request met `key` in flight (how it ends is counted by
    /// [`RecentKeys::request`]).
    pub fn conflict(&mut self, key: &ScopedKey, now_ms: u64) {
        if let Some(e) = self.entry(key, now_ms) {
            e.conflicts = e.conflicts.saturating_add(1);
            e.last_conflict_ms = Some(now_ms);
        }
    }

    /// An execution of `key` began in this process.
    pub fn started(&mut self, key: &ScopedKey, now_ms: u64) {
        if let Some(e) = self.entry(key, now_ms) {
            if e.running == 0 {
                e.running_since_ms = now_ms;
            }
            e.running = e.running.saturating_add(1);
        }
    }

    /// An execution of `key` that [`RecentKeys::started`] ended.
    pub fn ended(&mut self, key: &ScopedKey) {
        if let Some(e) = self.entries.get_mut(key) {
            e.running = e.running.saturating_sub(1);
        }
    }

    /// Keys held now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The dashboard's lists, each at most `per_list` long.
    pub fn snapshot(&self, per_list: usize) -> RecentSnapshot {
        let rows: Vec<RecentKey> = self
            .entries
            .iter()
            .map(|(k, e)| RecentKey {
                key: k.clone(),
                requests: e.requests,
                conflicts: e.conflicts,
                fenced: e.fenced,
                last_outcome: e.last_outcome,
                last_seen_ms: e.last_seen_ms,
                running_since_ms: (e.running > 0).then_some(e.running_since_ms),
                last_conflict_ms: e.last_conflict_ms,
                last_fenced_ms: e.last_fenced_ms,
            })
            .collect();
        // Ties go to the key seen last, then to the key's text: stable rows.
        let list =
            |keep: &dyn Fn(&RecentKey) -> bool,
             order: &dyn Fn(&RecentKey, &RecentKey) -> std::cmp::Ordering| {
                let mut v: Vec<RecentKey> = rows.iter().filter(|r| keep(r)).cloned().collect();
                v.sort_by(|a, b| {
                    order(a, b)
                        .then(b.last_seen_ms.cmp(&a.last_seen_ms))
                        .then_with(|| a.key.key.as_str().cmp(b.key.key.as_str()))
                });
                v.truncate(per_list);
                v
            };
        RecentSnapshot {
            tracked: self.entries.len(),
            capacity: self.capacity,
            inflight: list(&|r| r.running_since_ms.is_some(), &|a, b| {
                a.running_since_ms.cmp(&b.running_since_ms)
            }),
            most_retried: list(&|r| r.requests >= 2, &|a, b| b.requests.cmp(&a.requests)),
            conflicts: list(&|r| r.conflicts > 0, &|a, b| {
                b.last_conflict_ms.cmp(&a.last_conflict_ms)
            }),
            fenced: list(&|r| r.fenced > 0, &|a, b| {
                b.last_fenced_ms.cmp(&a.last_fenced_ms)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemgate_testkit::key;

    fn names(rows: &[RecentKey]) -> Vec<&str> {
        rows.iter().map(|r| r.key.key.as_str()).collect()
    }

    #[test]
    fn lists_retried_running_conflicting_and_fenced_keys() {
        let mut t = RecentKeys::new(100);
        for _ in 0..3 {
            t.request(&key("three"), RequestOutcome::Replayed, 10);
        }
        t.request(&key("two"), RequestOutcome::Executed, 11);
        t.request(&key("two"), RequestOutcome::Replayed, 12);
        t.request(&key("once"), RequestOutcome::Executed, 13);
        t.started(&key("slow"), 20);
        t.conflict(&key("slow"), 21);
        t.request(&key("slow"), RequestOutcome::Conflict, 21);
        t.request(&key("stale"), RequestOutcome::Fenced, 30);

        let s = t.snapshot(10);
        assert_eq!(s.tracked, 5);
        assert_eq!(names(&s.most_retried), ["three", "two"]);
        assert_eq!(s.most_retried[0].requests, 3);
        assert_eq!(names(&s.inflight), ["slow"]);
        assert_eq!(s.inflight[0].running_since_ms, Some(20));
        assert_eq!(names(&s.conflicts), ["slow"]);
        assert_eq!(s.conflicts[0].last_outcome, Some(RequestOutcome::Conflict));
        assert_eq!(names(&s.fenced), ["stale"]);
        assert_eq!(s.fenced[0].last_fenced_ms, Some(30));

        t.ended(&key("slow"));
        assert!(t.snapshot(10).inflight.is_empty());
        assert_eq!(t.snapshot(1).most_retried.len(), 1, "lists are cut");
    }

    #[test]
    fn a_full_table_forgets_the_least_recently_seen_key_never_a_running_one() {
        let mut t = RecentKeys::new(3);
        t.started(&key("running"), 1);
        t.request(&key("old"), RequestOutcome::Executed, 2);
        t.request(&key("newer"), RequestOutcome::Executed, 3);
        t.request(&key("old"), RequestOutcome::Replayed, 4);
        // Full: "newer" (seen at 3) goes; "running" (1) is kept.
        t.request(&key("new"), RequestOutcome::Executed, 5);
        let mut held: Vec<String> = t
            .snapshot(10)
            .inflight
            .iter()
            .chain(&t.snapshot(10).most_retried)
            .map(|r| r.key.key.as_str().to_owned())
            .collect();
        held.sort();
        assert_eq!(held, ["old", "running"]);
        assert_eq!(t.len(), 3);
        for i in 0..1000 {
            t.request(&key(&format!("k{i}")), RequestOutcome::Executed, 10 + i);
        }
        assert_eq!(t.len(), 3, "bounded");
        assert_eq!(names(&t.snapshot(10).inflight), ["running"]);
    }

    #[test]
    fn a_full_table_forgets_an_eighth_of_its_oldest_keys_at_once() {
        let mut t = RecentKeys::new(16);
        t.started(&key("running"), 0);
        for i in 0..15 {
            t.request(&key(&format!("k{i:02}")), RequestOutcome::Executed, 10 + i);
        }
        assert_eq!(t.len(), 16);
        // Full: the two least recently seen idle keys go, to make room.
        t.request(&key("new"), RequestOutcome::Executed, 100);
        assert_eq!(t.len(), 15);
        let held: Vec<String> = t
            .entries
            .keys()
            .map(|k| k.key.as_str().to_owned())
            .collect();
        assert!(held.iter().any(|k| k == "running"), "{held:?}");
        assert!(held.iter().any(|k| k == "new"), "{held:?}");
        assert!(!held.iter().any(|k| k == "k00" || k == "k01"), "{held:?}");
        assert!(held.iter().any(|k| k == "k02"), "{held:?}");
        // The room made takes the next key without another pass.
        t.request(&key("newer"), RequestOutcome::Executed, 101);
        assert_eq!(t.len(), 16);
    }

    #[test]
    fn a_full_table_of_running_keys_takes_no_new_key() {
        let mut t = RecentKeys::new(1);
        t.started(&key("a"), 1);
        t.request(&key("b"), RequestOutcome::Executed, 2);
        assert_eq!(t.len(), 1);
        assert_eq!(names(&t.snapshot(10).inflight), ["a"]);
        assert!(!t.is_empty());
    }
}
