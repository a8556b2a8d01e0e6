// paged-kv's test binary: every key of every sequence gathered through shuffled and shared pages, byte for byte.
use anyhow::{Result, ensure};
use lab::cudarc::driver::{LaunchConfig, PushKernelArg};
use lab::{Gpu, KernelSpec, Suite};
use paged_kv::*;

/// A case: page size, D, the sequences' lengths, and whether two sequences share their first page (a cached
/// prefix), over a pool with spare pages, the table's pages shuffled.
struct Case {
    page_size: usize,
    d: usize,
    lens: &'static [usize],
    shared_prefix: bool,
}

/// The pool (every byte a function of its place, never the output's poison) and a table of shuffled pages.
fn setup(c: &Case) -> (Pool, BlockTable, Vec<u8>) {
    let per: Vec<usize> = c.lens.iter().map(|l| l.div_ceil(c.page_size)).collect();
    let max_pages = per.iter().copied().max().unwrap_or(0).max(1);
    let num_pages = per.iter().sum::<usize>() + 5;
    let pool = Pool {
        num_pages,
        page_size: c.page_size,
        hkv: 2,
        d: c.d,
    };
    // Page ids handed out in a fixed shuffled order; -1 past each sequence's pages.
    let order: Vec<i32> = (0..num_pages as i32)
        .map(|i| (i * 7 + 3) % num_pages as i32)
        .collect();
    let mut next = order.into_iter();
    let mut pages = vec![-1i32; c.lens.len() * max_pages];
    for (b, &n) in per.iter().enumerate() {
        for p in 0..n {
            pages[b * max_pages + p] = next.next().unwrap();
        }
    }
    if c.shared_prefix && per.len() > 1 && per[0] > 0 && per[1] > 0 {
        pages[max_pages] = pages[0];
    }
    let cache: Vec<u8> = (0..pool.bytes())
        .map(|i| ((i * 131 + i / 4093) % 251) as u8)
        .collect();
    let t = BlockTable {
        max_pages,
        pages,
        seq_lens: c.lens.iter().map(|&l| l as i32).collect(),
    };
    (pool, t, cache)
}

/// `spec` (`gather_paged` or a mutant) on the case: where its output differs from the model's gather (every byte
/// of the output is written: it starts as 0xA5, which the gather never has past a sequence's end).
fn wrong(gpu: &Gpu, spec: &KernelSpec, c: &Case) -> Result<Vec<String>> {
    let (pool, t, cache) = setup(c);
    let tab = validate(&pool, &t)?;
    let max_len = c.lens.iter().copied().max().unwrap_or(1).max(1);
    let want = gather(&pool, &t, &cache, max_len);
    let st = &gpu.stream;
    let k = gpu.load(spec)?;
    let (dc, dp, dl) = (
        st.clone_htod(&cache)?,
        st.clone_htod(&t.pages)?,
        st.clone_htod(&t.seq_lens)?,
    );
    let mut out = st.clone_htod(&vec![0xA5u8; want.len()])?;
    let (hkv, d, ml) = (pool.hkv as i32, pool.d as i32, max_len as i32);
    let cfg = LaunchConfig {
        grid_dim: (
            (t.batch() * pool.hkv) as u32,
            max_len.div_ceil(64) as u32,
            1,
        ),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: gather_paged(const u8* pool, const int* pages[B·max_pages], const int* seq_lens[B], int max_pages,
    // int page_shift, int hkv, int d, int max_len, u8* out[B·hkv·max_len·d]); validate() checked every entry a
    // length reaches against the pool; the grid is (B·hkv, ⌈max_len / 64⌉) of 128 threads.
    unsafe {
        st.launch_builder(&k.func)
            .arg(&dc)
            .arg(&dp)
            .arg(&dl)
            .arg(&tab.max_pages)
            .arg(&tab.page_shift)
            .arg(&hkv)
            .arg(&d)
            .arg(&ml)
            .arg(&mut out)
            .launch(cfg)?
    };
    let got = st.clone_dtoh(&out)?;
    let row = |i: usize| {
        let r = i / pool.d;
        (r / max_len / pool.hkv, r / max_len % pool.hkv, r % max_len)
    };
    Ok((0..want.len())
        .filter(|&i| got[i] != want[i])
        .take(4)
        .map(|i| {
            let (b, h, key) = row(i);
            format!(
                "sequence {b} head {h} key {key} byte {}: {:#04x}, the model {:#04x}",
                i % pool.d,
                got[i],
                want[i]
            )
        })
        .collect())
}

const CASES: &[Case] = &[
    Case {
        page_size: 16,
        d: 64,
        lens: &[0, 1, 700],
        shared_prefix: false,
    },
    Case {
        page_size: 32,
        d: 128,
        lens: &[33, 64, 65, 1],
        shared_prefix: true,
    },
    Case {
        page_size: 64,
        d: 128,
        lens: &[8192, 512],
        shared_prefix: true,
    },
    Case {
        page_size: 128,
        d: 64,
        lens: &[129, 255, 256],
        shared_prefix: false,
    },
    Case {
        page_size: 256,
        d: 128,
        lens: &[1000, 256, 0],
        shared_prefix: true,
    },
];

fn main() {
    let mut t = Suite::new();
    t.kernels(&kernels());
    t.gpu("gather::every_key_of_every_sequence", |gpu| {
        for c in CASES {
            let w = wrong(gpu, &GATHER, c)?;
            ensure!(
                w.is_empty(),
                "page size {}, D = {}, lengths {:?}: {}",
                c.page_size,
                c.d,
                c.lens,
                w.join("; ")
            );
        }
        eprintln!(
            "gather_paged: page sizes 16–256, D = 64 and 128, lengths 0 to 8192, shuffled and shared pages: every byte as the model"
        );
        Ok(())
    });
    for (name, from, to, unnoticed) in [
        (
            "page_off_by_one_at_the_page_end",
            "(key >> t.page_shift)",
            "((key + 1) >> t.page_shift)",
            "the last key of every page read from the next page",
        ),
        (
            "row_without_the_mask",
            "(key & ((1 << t.page_shift) - 1))",
            "(key & (1 << t.page_shift))",
            "keys placed by one bit of their index",
        ),
    ] {
        // In a process of its own: a mutant may read outside the pool, which the device can abort the context for
        // (counted as caught).
        t.gpu_isolated(&format!("gather::mutant::{name}"), move |gpu| {
            let bad = GATHER.mutated("paged_kv.cuh", from, to)?;
            let mut caught = vec![];
            for c in CASES
                .iter()
                .filter(|c| c.lens.iter().any(|&l| l > c.page_size))
            {
                match wrong(gpu, &bad, c) {
                    Ok(w) => caught.push(!w.is_empty()),
                    Err(e) => {
                        eprintln!("the device refused the mutant: {e:#}");
                        return Ok(());
                    }
                }
            }
            ensure!(
                caught.iter().all(|&x| x),
                "{unnoticed} went unnoticed in {} of {} cases",
                caught.iter().filter(|&&x| !x).count(),
                caught.len()
            );
            Ok(())
        });
    }
    t.run()
}
