// The cp-async-ring model: the ring's state machine, the schedule the device runs, and its invariants.
use std::collections::VecDeque;

/// One step of the pipeline, as every thread of the block performs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Copy tile t into stage(t) and commit one group (empty when t ≥ tiles).
    Issue(usize),
    /// `cp.async.wait_group(depth)` + barrier, then tile t is read from stage(t).
    Wait(usize),
    /// Done reading tile t (barrier).
    Release(usize),
}

/// The ring's parameters as the device header fixes them.
#[derive(Debug, Clone, Copy)]
pub struct Ring {
    pub stages: usize,
    /// Groups allowed to stay in flight at `Wait`: the header waits with `STAGES − 1`.
    pub wait_depth: usize,
    /// Which stage the consumer reads tile t from: the header's `t % STAGES`.
    pub read_offset: usize,
}

impl Ring {
    pub fn new(stages: usize) -> Self {
        Ring {
            stages,
            wait_depth: stages - 1,
            read_offset: 0,
        }
    }
    fn stage(&self, t: usize) -> usize {
        t % self.stages
    }
}

/// The schedule `cuda/cp_async_ring.cuh` documents and the test kernel runs: a prologue of STAGES − 1
/// issues, then per tile: issue t + STAGES − 1, wait t, release t.
pub fn schedule(stages: usize, tiles: usize) -> Vec<Event> {
    let mut v: Vec<Event> = (0..stages - 1).map(Event::Issue).collect();
    for t in 0..tiles {
        v.extend([
            Event::Issue(t + stages - 1),
            Event::Wait(t),
            Event::Release(t),
        ]);
    }
    v
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Free,
    InFlight(usize),
    Landed(usize),
    Reading(usize),
}

/// Runs `events` through the state machine and checks the ring's invariants: no stage is read before its
/// tile has landed, no stage is overwritten while it is read or before its tile was read, and tiles are read
/// once each, in order. The first violation is the error.
pub fn check(ring: &Ring, tiles: usize, events: &[Event]) -> Result<(), String> {
    let mut st = vec![Stage::Free; ring.stages];
    let mut groups: VecDeque<Option<usize>> = VecDeque::new(); // in-flight groups, oldest first
    let mut next_read = 0usize;
    for (k, &e) in events.iter().enumerate() {
        let at = |msg: String| format!("event {k} ({e:?}): {msg}");
        match e {
            Event::Issue(t) => {
                if t < tiles {
                    let s = ring.stage(t);
                    match st[s] {
                        Stage::Free => {}
                        Stage::Reading(u) => {
                            return Err(at(format!(
                                "stage {s} overwritten while tile {u} is read"
                            )));
                        }
                        Stage::InFlight(u) | Stage::Landed(u) => {
                            return Err(at(format!(
                                "stage {s} overwritten before tile {u} was read"
                            )));
                        }
                    }
                    st[s] = Stage::InFlight(t);
                    groups.push_back(Some(t));
                } else {
                    groups.push_back(None);
                }
            }
            Event::Wait(t) => {
                if t != next_read {
                    return Err(at(format!(
                        "tile {t} read out of order (expected {next_read})"
                    )));
                }
                while groups.len() > ring.wait_depth {
                    if let Some(u) = groups.pop_front().flatten() {
                        let s = ring.stage(u);
                        if st[s] == Stage::InFlight(u) {
                            st[s] = Stage::Landed(u);
                        }
                    }
                }
                let s = (t + ring.read_offset) % ring.stages;
                match st[s] {
                    Stage::Landed(u) if u == t => st[s] = Stage::Reading(t),
                    Stage::InFlight(u) if u == t => {
                        return Err(at(format!("tile {t} read from stage {s} before it landed")));
                    }
                    other => {
                        return Err(at(format!(
                            "tile {t} read from stage {s}, which holds {other:?}"
                        )));
                    }
                }
                next_read += 1;
            }
            Event::Release(t) => {
                let s = (t + ring.read_offset) % ring.stages;
                if st[s] != Stage::Reading(t) {
                    return Err(at(format!(
                        "release of tile {t}, but stage {s} holds {:?}",
                        st[s]
                    )));
                }
                st[s] = Stage::Free;
            }
        }
    }
    if next_read != tiles {
        return Err(format!("{next_read} of {tiles} tiles were read"));
    }
    Ok(())
}

/// Rows of tile t that are real: `min(rows_per_tile, S − t·rows_per_tile)`, the rest are zero-filled.
pub fn valid_rows(seq_rows: usize, rows_per_tile: usize, t: usize) -> usize {
    seq_rows
        .saturating_sub(t * rows_per_tile)
        .min(rows_per_tile)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn the_devices_schedule_keeps_every_invariant(stages in 2usize..=4, tiles in 0usize..60) {
            prop_assert_eq!(check(&Ring::new(stages), tiles, &schedule(stages, tiles)), Ok(()));
        }

        #[test]
        fn waiting_for_one_group_too_few_reads_before_landing(stages in 2usize..=4, tiles in 1usize..60) {
            let ring = Ring { wait_depth: stages, ..Ring::new(stages) };
            let e = check(&ring, tiles, &schedule(stages, tiles)).unwrap_err();
            prop_assert!(e.contains("before it landed"), "{}", e);
        }

        #[test]
        fn an_off_by_one_stage_is_caught(stages in 2usize..=4, tiles in 1usize..60) {
            let ring = Ring { read_offset: 1, ..Ring::new(stages) };
            prop_assert!(check(&ring, tiles, &schedule(stages, tiles)).is_err());
        }

        #[test]
        fn issuing_a_stage_too_early_overwrites_it(stages in 2usize..=4, extra in 1usize..60) {
            // Past `stages` tiles, so the early issue is a real copy into a stage still holding tile 0.
            let tiles = stages + extra;
            // One extra tile in the prologue: its stage still holds an unread tile.
            let mut ev: Vec<Event> = (0..stages).map(Event::Issue).collect();
            for t in 0..tiles {
                ev.extend([Event::Issue(t + stages), Event::Wait(t), Event::Release(t)]);
            }
            let e = check(&Ring::new(stages), tiles, &ev).unwrap_err();
            prop_assert!(e.contains("overwritten"), "{}", e);
        }
    }

    #[test]
    fn a_missing_wait_is_caught() {
        // A consumer that never waits: the wait depth is effectively unbounded.
        let ring = Ring {
            wait_depth: usize::MAX,
            ..Ring::new(3)
        };
        assert!(
            check(&ring, 5, &schedule(3, 5))
                .unwrap_err()
                .contains("before it landed")
        );
    }

    #[test]
    fn a_release_skipped_lets_the_refill_hit_a_stage_being_read() {
        let mut ev = schedule(2, 4);
        ev.retain(|e| *e != Event::Release(1));
        assert!(
            check(&Ring::new(2), 4, &ev)
                .unwrap_err()
                .contains("while tile 1 is read")
        );
    }

    #[test]
    fn valid_rows_of_the_tail() {
        assert_eq!(
            (
                valid_rows(100, 32, 0),
                valid_rows(100, 32, 3),
                valid_rows(100, 32, 4)
            ),
            (32, 4, 0)
        );
    }
}
