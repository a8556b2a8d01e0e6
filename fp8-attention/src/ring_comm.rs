// A ring's NCCL communicator that another thread can abort: a rank blocked inside NCCL ends by its deadline.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use lab::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use lab::cudarc::nccl::{Id, NcclType, result, sys};

use crate::error::{Error, Result};

/// An NCCL call's error as the library's, naming the call.
pub(crate) fn nccl(what: &str) -> impl Fn(result::NcclError) -> Error + '_ {
    move |e| Error::Device(anyhow::anyhow!("NCCL {what}: {e:?}"))
}

/// NCCL_CONFIG_INITIALIZER for the struct of NCCL 2.28's header (cudarc's `nccl-02028`): every attribute undefined,
/// so NCCL applies its own default to each one not set.
fn default_config() -> sys::ncclConfig_t {
    const UNDEF: i32 = i32::MIN;
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        version: 22800,
        blocking: UNDEF,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
    }
}

/// One rank's NCCL communicator, made on `stream` (its operations are queued there). Unlike cudarc's `Comm`, it can be
/// aborted from another thread ([`RingComm::abort`]): NCCL's host calls block while a connection to a peer is set up
/// (the first send to it, in `ncclGroupEnd`), so a peer that stopped leaves a rank blocked on the host, where no
/// deadline of its own can end the wait; [`RingComm::watched`] runs a rank's work with a watchdog that aborts the
/// communicator at the deadline, which ends that wait with an error. Dropping it aborts it (once).
#[derive(Debug)]
pub struct RingComm {
    comm: sys::ncclComm_t,
    stream: Arc<CudaStream>,
    rank: usize,
    world: usize,
    aborted: AtomicBool,
}

// SAFETY: the handle is only used by the thread that owns the RingComm, except for ncclCommAbort, which NCCL allows
// from another thread while a call on the communicator is blocked (that is how a stalled rank is unblocked); `aborted`
// makes the abort happen once.
unsafe impl Send for RingComm {}
unsafe impl Sync for RingComm {}

impl RingComm {
    /// Rank `rank` of `world` of the communicator `id` names, its operations on `stream`, its kernels as wide as NCCL
    /// picks (blocks until every rank has joined, as ncclCommInitRank does).
    pub fn from_rank(
        stream: Arc<CudaStream>,
        rank: usize,
        world: usize,
        id: &Id,
    ) -> Result<RingComm> {
        Self::from_rank_with(stream, rank, world, id, None)
    }

    /// [`RingComm::from_rank`] with NCCL's kernels held to `max_ctas` blocks, or (None) as many as NCCL picks (32 p2p
    /// channels a peer on an H100 host with NVSwitch). Held to 4 or 16, a four-GPU ring's steps were no nearer their
    /// launches alone than with NCCL's own width (docs/decisions.md, "NCCL's blocks held"): an A/B, not a default.
    pub fn from_rank_with(
        stream: Arc<CudaStream>,
        rank: usize,
        world: usize,
        id: &Id,
        max_ctas: Option<usize>,
    ) -> Result<RingComm> {
        if rank >= world {
            return Err(Error::Ring(format!("rank {rank} of a ring of {world}")));
        }
        if max_ctas == Some(0) {
            return Err(Error::Ring(
                "NCCL's kernels need at least one block (max_ctas = 0)".into(),
            ));
        }
        let mut comm = std::mem::MaybeUninit::uninit();
        let uid = sys::ncclUniqueId {
            internal: *id.internal(),
        };
        // SAFETY: `comm` is written by NCCL before it is read; world and rank are checked above; `config` is NCCL's
        // initializer for the struct cudarc declares (nccl-02028), read during the call only. Without a cap, the
        // plain ncclCommInitRank (no config struct for an NCCL of another version to refuse).
        let comm = unsafe {
            match max_ctas {
                Some(n) => {
                    let mut config = default_config();
                    config.maxCTAs = n.min(i32::MAX as usize) as i32;
                    result::comm_init_rank_config(
                        comm.as_mut_ptr(),
                        world as i32,
                        uid,
                        rank as i32,
                        &mut config,
                    )
                    .map_err(nccl("ncclCommInitRankConfig"))?;
                }
                None => {
                    result::comm_init_rank(comm.as_mut_ptr(), world as i32, uid, rank as i32)
                        .map_err(nccl("ncclCommInitRank"))?;
                }
            }
            comm.assume_init()
        };
        Ok(RingComm {
            comm,
            stream,
            rank,
            world,
            aborted: AtomicBool::new(false),
        })
    }

    /// The stream the communicator's operations are queued on.
    pub fn stream(&self) -> Arc<CudaStream> {
        self.stream.clone()
    }

    /// This rank (0 … world − 1).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The ranks of the ring.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// Whether the communicator was aborted (by a watchdog's deadline, or by [`RingComm::abort`]): it can run nothing
    /// more; every rank makes a new one.
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// Aborts the communicator (once; from any thread): NCCL calls blocked on it return, its queued operations end.
    pub fn abort(&self) {
        if !self.aborted.swap(true, Ordering::AcqRel) {
            // SAFETY: the handle came from ncclCommInitRank and is aborted exactly once; its result is not needed
            // (an abort that fails leaves nothing more to do).
            let _ = unsafe { result::comm_abort(self.comm) };
        }
    }

    /// Fails by name, before anything is queued, where the communicator was aborted.
    fn live(&self) -> Result<()> {
        if self.is_aborted() {
            return Err(Error::Ring(format!(
                "rank {}: the communicator was aborted (a ring before ran past its deadline); make a new one on \
                 every rank",
                self.rank
            )));
        }
        Ok(())
    }

    /// Queues a send of `data` to rank `peer` (inside a group: [`group`]).
    pub fn send<T: NcclType>(
        &self,
        data: &lab::cudarc::driver::CudaView<T>,
        peer: usize,
    ) -> Result<()> {
        self.live()?;
        let (src, _record) = data.device_ptr(&self.stream);
        // SAFETY: `src` is `data.len()` elements of T on this communicator's device, read in stream order.
        unsafe {
            result::send(
                src as _,
                data.len(),
                T::as_nccl_type(),
                peer as i32,
                self.comm,
                self.stream.cu_stream() as _,
            )
        }
        .map(|_| ())
        .map_err(nccl("send"))
    }

    /// Queues a receive into `data` from rank `peer` (inside a group: [`group`]).
    pub fn recv<T: NcclType>(
        &self,
        data: &mut lab::cudarc::driver::CudaViewMut<T>,
        peer: usize,
    ) -> Result<()> {
        self.live()?;
        let n = data.len();
        let (dst, _record) = data.device_ptr_mut(&self.stream);
        // SAFETY: `dst` is `n` elements of T on this communicator's device, written in stream order.
        unsafe {
            result::recv(
                dst as _,
                n,
                T::as_nccl_type(),
                peer as i32,
                self.comm,
                self.stream.cu_stream() as _,
            )
        }
        .map(|_| ())
        .map_err(nccl("recv"))
    }

    /// Queues every rank's largest `send` into `recv` (an all-reduce, max).
    pub fn all_reduce_max(&self, send: &CudaSlice<i32>, recv: &mut CudaSlice<i32>) -> Result<()> {
        self.live()?;
        let n = send.len();
        if recv.len() != n {
            return Err(Error::Ring(format!(
                "all-reduce of {n} values into {}",
                recv.len()
            )));
        }
        let (src, _rs) = send.device_ptr(&self.stream);
        let (dst, _rd) = recv.device_ptr_mut(&self.stream);
        // SAFETY: both are `n` i32 on this communicator's device, in stream order.
        unsafe {
            result::all_reduce(
                src as _,
                dst as _,
                n,
                i32::as_nccl_type(),
                sys::ncclRedOp_t::ncclMax,
                self.comm,
                self.stream.cu_stream() as _,
            )
        }
        .map(|_| ())
        .map_err(nccl("all-reduce"))
    }

    /// Runs `f` (this rank's work on the communicator) under a watchdog: where `f` has not returned by `deadline`,
    /// another thread aborts the communicator, so that a call blocked inside NCCL returns; `f`'s error is then named as
    /// the stall. An `f` that returns in time leaves the communicator as it was.
    pub fn watched<T>(
        &self,
        deadline: Instant,
        what: &str,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        self.live()?;
        let (r, fired) = with_watchdog(deadline, || self.abort(), f);
        match r {
            Err(e) if fired => Err(Error::Ring(format!(
                "rank {}: {what} did not finish in time (a peer stopped or failed, or the link is down); the \
                 communicator was aborted ({e})",
                self.rank
            ))),
            r => r,
        }
    }
}

/// Runs `f` on this thread while another waits for `deadline`: where `f` has not returned by then, `fire` is called
/// once, from that thread (`f` runs on until it returns: `fire` is what makes it return). `f`'s result, and whether
/// `fire` was called.
fn with_watchdog<T>(deadline: Instant, fire: impl Fn() + Sync, f: impl FnOnce() -> T) -> (T, bool) {
    let done = (Mutex::new(false), Condvar::new());
    let fired = AtomicBool::new(false);
    let r = std::thread::scope(|sc| {
        sc.spawn(|| {
            let (lock, cv) = &done;
            let mut finished = lock.lock().unwrap_or_else(|p| p.into_inner());
            while !*finished {
                let now = Instant::now();
                if now >= deadline {
                    fired.store(true, Ordering::Release);
                    fire();
                    return;
                }
                finished = cv
                    .wait_timeout(finished, deadline - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        });
        let r = f();
        *done.0.lock().unwrap_or_else(|p| p.into_inner()) = true;
        done.1.notify_one();
        r
    });
    (r, fired.load(Ordering::Acquire))
}

impl Drop for RingComm {
    fn drop(&mut self) {
        self.abort();
    }
}

/// Runs `f` between ncclGroupStart and ncclGroupEnd (the group's sends and receives go out together); the end is
/// where NCCL connects to a new peer, and blocks while it does.
pub fn group(f: impl FnOnce() -> Result<()>) -> Result<()> {
    result::group_start().map_err(nccl("group start"))?;
    let r = f();
    let end = result::group_end().map(|_| ()).map_err(nccl("group end"));
    r.and(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_config_is_nccls_initializer_for_its_header() {
        // NCCL refuses a config whose size, magic or version it does not know; every attribute left undefined takes
        // NCCL's default (a 2.28 struct: 17 fields, 80 bytes on x86_64).
        let c = default_config();
        assert_eq!(c.size, std::mem::size_of::<sys::ncclConfig_t>());
        assert_eq!(c.size, 80);
        assert_eq!((c.magic, c.version), (0xcafe_beef, 22800));
        let ints = [
            c.blocking,
            c.cgaClusterSize,
            c.minCTAs,
            c.maxCTAs,
            c.splitShare,
            c.trafficClass,
            c.collnetEnable,
            c.CTAPolicy,
            c.shrinkShare,
            c.nvlsCTAs,
            c.nChannelsPerNetPeer,
            c.nvlinkCentricSched,
        ];
        assert!(ints.iter().all(|&v| v == i32::MIN), "{ints:?}");
        assert!(c.netName.is_null() && c.commName.is_null());
    }

    #[test]
    fn a_call_that_returns_in_time_is_left_alone() {
        let (r, fired) = with_watchdog(
            Instant::now() + Duration::from_secs(5),
            || panic!("fired"),
            || 7,
        );
        assert_eq!((r, fired), (7, false));
    }

    #[test]
    fn a_blocked_call_is_ended_by_the_watchdog_at_its_deadline() {
        // `f` stands for a call blocked inside NCCL: it returns only once `fire` (the abort) has run.
        let unblocked = AtomicBool::new(false);
        let t0 = Instant::now();
        let (r, fired) = with_watchdog(
            t0 + Duration::from_millis(50),
            || unblocked.store(true, Ordering::Release),
            || {
                while !unblocked.load(Ordering::Acquire) {
                    assert!(
                        t0.elapsed() < Duration::from_secs(10),
                        "the watchdog never fired"
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
                "aborted"
            },
        );
        assert_eq!((r, fired), ("aborted", true));
        assert!(
            t0.elapsed() >= Duration::from_millis(50),
            "fired early: {:?}",
            t0.elapsed()
        );
    }

    #[test]
    fn a_deadline_already_past_fires_at_once() {
        let n = std::sync::atomic::AtomicUsize::new(0);
        let unblocked = AtomicBool::new(false);
        let (_, fired) = with_watchdog(
            Instant::now(),
            || {
                n.fetch_add(1, Ordering::AcqRel);
                unblocked.store(true, Ordering::Release);
            },
            || {
                while !unblocked.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            },
        );
        assert!(fired);
        assert_eq!(n.load(Ordering::Acquire), 1, "fired once");
    }
}
