//! The byte budget for payloads in memory, shared by every connection.
//!
//! A payload takes room as its bytes arrive, a chunk ahead of them ([`Claim::hold`]), never at
//! the size its header announces: a client that announces 100 MiB and sends 150 bytes holds one
//! chunk. Once the payload is whole its claim becomes a [`Room`], given back when its buffer is
//! dropped (after the store wrote it). When the budget is spent a payload waits, first come first
//! served, while TCP flow control slows its client, and the server's memory does not grow with
//! the number of clients.
//!
//! Room held by payloads still arriving could deadlock: every claim waiting for room the others
//! hold. And a client that sends fast, then stops, would keep what it got until the minimum data
//! rate cuts it. So a claim that has waited [`TICK`] looks at the others and cuts one:
//!
//! 1. the claim stalled longest, if one has received nothing for [`STALL`] (it yields its room
//!    to a client that is sending);
//! 2. otherwise, if every byte taken is held by claims that are themselves waiting (nothing will
//!    ever be given back), the youngest of them: the oldest requests finish first.
//!
//! A cut claim's connection is closed (the client sees its request fail); nothing stored is lost.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Granularity of the budget: permits are counted in these.
const UNIT: u64 = 64 << 10;

/// How long a claim waits for room before it looks for one to cut.
pub const TICK: Duration = Duration::from_millis(100);

/// A claim that has received nothing for this long while others wait for room is cut.
pub const STALL: Duration = Duration::from_secs(1);

/// A byte budget.
#[derive(Debug, Clone)]
pub struct Budget {
    sem: Arc<Semaphore>,
    units: u32,
    claims: Arc<Mutex<Claims>>,
}

/// Every open claim, by id.
#[derive(Debug, Default)]
struct Claims {
    next: u64,
    open: HashMap<u64, ClaimState>,
}

#[derive(Debug)]
struct ClaimState {
    started: Instant,
    last_progress: Instant,
    /// Units held.
    held: u32,
    waiting: bool,
    cut: Arc<Notify>,
}

/// Room taken from a [`Budget`]; returned when dropped.
#[derive(Debug)]
pub struct Room(#[expect(dead_code, reason = "held for its Drop")] Option<OwnedSemaphorePermit>);

/// Why a claim could not grow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// Cut to break a deadlock or to free room for clients that are sending.
    #[error("the server needed its memory for other clients (--max-inflight is spent)")]
    Cut,
    /// No room came within the patience given.
    #[error("no memory came free for {0:?} (--max-inflight is spent)")]
    Starved(Duration),
}

/// Room for one payload as it arrives; unregistered when dropped or made a [`Room`].
#[derive(Debug)]
pub struct Claim {
    budget: Budget,
    id: u64,
    permit: Option<OwnedSemaphorePermit>,
    cut: Arc<Notify>,
}

fn units_for(bytes: u64) -> u64 {
    bytes.div_ceil(UNIT)
}

impl Budget {
    /// A budget of `bytes` (rounded up to 64 KiB; at least one unit).
    pub fn new(bytes: u64) -> Budget {
        let units = u32::try_from(units_for(bytes).max(1)).unwrap_or(u32::MAX).min(Semaphore::MAX_PERMITS as u32);
        Budget { sem: Arc::new(Semaphore::new(units as usize)), units, claims: Arc::default() }
    }

    /// Opens a claim holding nothing yet.
    pub fn claim(&self) -> Claim {
        let now = Instant::now();
        let cut = Arc::new(Notify::new());
        let mut claims = self.lock();
        let id = claims.next;
        claims.next += 1;
        claims.open.insert(
            id,
            ClaimState { started: now, last_progress: now, held: 0, waiting: false, cut: Arc::clone(&cut) },
        );
        Claim { budget: self.clone(), id, permit: None, cut }
    }

    /// Bytes free now.
    pub fn free_bytes(&self) -> u64 {
        self.sem.available_permits() as u64 * UNIT
    }

    /// Bytes in all.
    pub fn total_bytes(&self) -> u64 {
        u64::from(self.units) * UNIT
    }

    fn lock(&self) -> MutexGuard<'_, Claims> {
        self.claims.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The claim to cut for `waiter`, by the rules in the module's comment.
    fn victim(&self, waiter: u64) -> Option<(u64, Arc<Notify>)> {
        let claims = self.lock();
        let now = Instant::now();
        let stalled = claims
            .open
            .iter()
            .filter(|(id, c)| **id != waiter && !c.waiting && c.held > 0 && now - c.last_progress >= STALL)
            .min_by_key(|(_, c)| c.last_progress);
        if let Some((id, c)) = stalled {
            return Some((*id, Arc::clone(&c.cut)));
        }
        let taken = u64::from(self.units) - self.sem.available_permits() as u64;
        let held_by_waiters: u64 = claims.open.values().filter(|c| c.waiting).map(|c| u64::from(c.held)).sum();
        if taken > held_by_waiters {
            // Someone else holds room and will give it back.
            return None;
        }
        claims
            .open
            .iter()
            .filter(|(_, c)| c.waiting && c.held > 0)
            .max_by_key(|(_, c)| c.started)
            .map(|(id, c)| (*id, Arc::clone(&c.cut)))
    }
}

impl Claim {
    /// Bytes held.
    pub fn held_bytes(&self) -> u64 {
        self.permit.as_ref().map_or(0, |p| p.num_permits() as u64 * UNIT)
    }

    /// Grows the claim to at least `bytes` in all (at most the whole budget), waiting for room
    /// at most `patience`; while waiting, cuts another claim when the rules say so.
    pub async fn hold(&mut self, bytes: u64, patience: Duration) -> Result<(), ClaimError> {
        let want = units_for(bytes).min(u64::from(self.budget.units));
        let have = self.permit.as_ref().map_or(0, |p| p.num_permits() as u64);
        let Some(more) = want.checked_sub(have).filter(|m| *m > 0) else { return Ok(()) };
        let more = u32::try_from(more).unwrap_or(u32::MAX);
        let got = match Arc::clone(&self.budget.sem).try_acquire_many_owned(more) {
            Ok(p) => p,
            Err(_) => self.wait(more, patience).await?,
        };
        match &mut self.permit {
            Some(p) => p.merge(got),
            None => self.permit = Some(got),
        }
        let held = self.permit.as_ref().map_or(0, |p| u32::try_from(p.num_permits()).unwrap_or(u32::MAX));
        if let Some(c) = self.budget.lock().open.get_mut(&self.id) {
            c.held = held;
        }
        Ok(())
    }

    async fn wait(&self, more: u32, patience: Duration) -> Result<OwnedSemaphorePermit, ClaimError> {
        self.set_waiting(true);
        let started = Instant::now();
        let acquire = Arc::clone(&self.budget.sem).acquire_many_owned(more);
        tokio::pin!(acquire);
        let got = loop {
            tokio::select! {
                got = &mut acquire => break got.ok(),
                () = self.cut.notified() => break None,
                () = tokio::time::sleep(TICK) => {}
            }
            if started.elapsed() >= patience {
                self.set_waiting(false);
                return Err(ClaimError::Starved(patience));
            }
            match self.budget.victim(self.id) {
                Some((id, _)) if id == self.id => break None,
                Some((id, cut)) => {
                    tracing::info!(claim = id, "cutting a request to free memory for others waiting");
                    cut.notify_one();
                }
                None => {}
            }
        };
        self.set_waiting(false);
        // The semaphore is never closed: only a cut ends the wait without room.
        got.ok_or(ClaimError::Cut)
    }

    fn set_waiting(&self, waiting: bool) {
        if let Some(c) = self.budget.lock().open.get_mut(&self.id) {
            c.waiting = waiting;
        }
    }

    /// Records that bytes arrived (a claim that receives nothing may be cut for others).
    pub fn progressed(&self) {
        if let Some(c) = self.budget.lock().open.get_mut(&self.id) {
            c.last_progress = Instant::now();
        }
    }

    /// Resolves when another claim cut this one; the payload must then be given up.
    pub async fn cut(&self) {
        self.cut.notified().await;
    }

    /// The payload is whole: keeps its room until the returned [`Room`] is dropped.
    pub fn into_room(mut self) -> Room {
        Room(self.permit.take())
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.budget.lock().open.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime")
    }

    #[test]
    fn room_is_held_as_claimed_and_returned() {
        rt().block_on(async {
            let b = Budget::new(1 << 20);
            assert_eq!(b.total_bytes(), 1 << 20);
            let mut a = b.claim();
            a.hold(100, Duration::from_secs(1)).await.expect("room");
            assert_eq!(a.held_bytes(), UNIT, "a claim holds what arrived, in units, not what was announced");
            a.hold(600 << 10, Duration::from_secs(1)).await.expect("room");
            assert_eq!(b.free_bytes(), (1 << 20) - (640 << 10));
            let room = a.into_room();
            assert_eq!(b.free_bytes(), (1 << 20) - (640 << 10), "the room outlives the claim");
            drop(room);
            assert_eq!(b.free_bytes(), 1 << 20);
            // Larger than the budget: takes all of it rather than waiting forever.
            let mut all = b.claim();
            all.hold(10 << 20, Duration::from_secs(1)).await.expect("room");
            assert_eq!(b.free_bytes(), 0);
            drop(all);
            assert_eq!(b.free_bytes(), 1 << 20);
        });
    }

    #[test]
    fn a_waiter_gets_room_when_it_is_given_back() {
        rt().block_on(async {
            let b = Budget::new(1 << 20);
            let mut a = b.claim();
            a.hold(1 << 20, Duration::from_secs(1)).await.expect("room");
            let room = a.into_room();
            let mut w = b.claim();
            let waiting = tokio::spawn(async move { w.hold(512 << 10, Duration::from_secs(5)).await });
            tokio::time::sleep(TICK * 3).await;
            assert!(!waiting.is_finished(), "room held by a finished payload is waited for, not cut");
            drop(room);
            assert_eq!(waiting.await.expect("task"), Ok(()));
        });
    }

    #[test]
    fn a_stalled_claim_is_cut_for_a_waiter() {
        rt().block_on(async {
            let b = Budget::new(1 << 20);
            let mut stalled = b.claim();
            stalled.hold(1 << 20, Duration::from_secs(1)).await.expect("room");
            let mut w = b.claim();
            let waiting = tokio::spawn(async move { w.hold(512 << 10, Duration::from_secs(10)).await });
            // The stalled claim's connection learns it was cut, and gives its room up.
            tokio::time::timeout(STALL * 3, stalled.cut()).await.expect("the stalled claim was cut");
            drop(stalled);
            assert_eq!(waiting.await.expect("task"), Ok(()));
        });
    }

    #[test]
    fn a_deadlock_of_waiting_claims_is_broken_by_cutting_the_youngest() {
        rt().block_on(async {
            let b = Budget::new(1 << 20);
            let mut old = b.claim();
            old.hold(512 << 10, Duration::from_secs(1)).await.expect("room");
            tokio::time::sleep(Duration::from_millis(5)).await;
            let mut young = b.claim();
            young.hold(512 << 10, Duration::from_secs(1)).await.expect("room");
            // Both want more than is left while holding the rest: neither would ever finish.
            let old = tokio::spawn(async move { (old.hold(1 << 20, Duration::from_secs(10)).await, old) });
            let young = tokio::spawn(async move { (young.hold(1 << 20, Duration::from_secs(10)).await, young) });
            let (young_got, young) = young.await.expect("task");
            assert_eq!(young_got, Err(ClaimError::Cut), "the younger request gives way");
            drop(young);
            let (old_got, _old) = old.await.expect("task");
            assert_eq!(old_got, Ok(()), "the older request finishes");
        });
    }

    #[test]
    fn a_waiter_gives_up_after_its_patience() {
        rt().block_on(async {
            let b = Budget::new(1 << 20);
            let mut a = b.claim();
            a.hold(1 << 20, Duration::from_secs(1)).await.expect("room");
            let _room = a.into_room();
            let mut w = b.claim();
            assert_eq!(w.hold(1, TICK * 2).await, Err(ClaimError::Starved(TICK * 2)));
        });
    }
}
