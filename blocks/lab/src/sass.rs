// SASS opcode histograms of compiled kernels, through nvdisasm (the toolkit's, or NVIDIA's pip wheel).
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result, anyhow, bail};

use crate::compile::Cubin;

/// The wheel that brings nvdisasm to a machine without the toolkit (about 4 MB). 13.2 is the oldest CUDA 13
/// nvdisasm on PyPI; it reads the cubins NVRTC 13.0 makes.
pub const NVDISASM_WHEEL: &str = "nvidia-cuda-nvdisasm==13.2.51";

fn find_nvdisasm() -> Result<PathBuf> {
    let mut places: Vec<PathBuf> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            places.push(PathBuf::from(v).join("bin/nvdisasm"));
        }
    }
    places.push(PathBuf::from("/usr/local/cuda/bin/nvdisasm"));
    let local = crate::toolchain::default_local_dir().with_file_name("nvdisasm");
    let bin = local.join("nvidia/cu13/bin/nvdisasm");
    places.push(bin.clone());
    if let Some(p) = places.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    if std::env::var("LAB_NO_INSTALL").is_ok_and(|v| v == "1") {
        bail!(
            "nvdisasm not found (looked at {places:?}) and installing is disabled (LAB_NO_INSTALL=1)"
        );
    }
    crate::toolchain::install_into(&local, &[NVDISASM_WHEEL], |d| {
        d.join("nvidia/cu13/bin/nvdisasm").is_file()
    })?;
    Ok(bin)
}

/// The process's nvdisasm, found or installed once.
pub fn nvdisasm() -> Result<&'static PathBuf> {
    static P: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    P.get_or_init(|| find_nvdisasm().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("{e}"))
}

/// Opcode (without modifiers: `HMMA.16816.F32` counts as `HMMA`) → count, for one kernel of a cubin.
pub fn histogram(cubin: &Cubin, kernel: &str) -> Result<BTreeMap<String, usize>> {
    Ok(parse_sass(&listing(cubin, kernel)?))
}

/// One kernel's SASS as nvdisasm prints it (what `cargo xtask sass` shows a kernel engineer).
pub fn listing(cubin: &Cubin, kernel: &str) -> Result<String> {
    disassemble(cubin, kernel, &[])
}

/// One kernel's SASS with each instruction's control code decoded (`cargo xtask sass --control`).
pub fn controlled(cubin: &Cubin, kernel: &str) -> Result<Vec<Controlled>> {
    let l = disassemble(cubin, kernel, &["-hex"])?;
    let v = parse_controlled(&l);
    if v.is_empty() {
        bail!("nvdisasm -hex gave no instruction encodings for `{kernel}`");
    }
    Ok(v)
}

/// One kernel's hot loop and its schedule (`hot_loop_schedule`; `cargo xtask sass --loop`), or None.
pub fn hot_loop(cubin: &Cubin, kernel: &str) -> Result<Option<(HotLoop, Vec<String>)>> {
    Ok(hot_loop_schedule(&disassemble(cubin, kernel, &["-hex"])?))
}

fn disassemble(cubin: &Cubin, kernel: &str, args: &[&str]) -> Result<String> {
    let dir = std::env::temp_dir().join(format!("lab-sass-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // One file per call: tests of one process disassemble the same kernel concurrently (its compile test
    // checks the SASS it requires while its snapshot test tables it), and must not share a path.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("{}-{}-{kernel}-{n}.cubin", cubin.file, cubin.arch));
    std::fs::write(&path, &cubin.image)?;
    let out = Command::new(nvdisasm()?)
        .args(args)
        .arg(&path)
        .output()
        .context("running nvdisasm")?;
    let _ = std::fs::remove_file(&path);
    if !out.status.success() {
        bail!(
            "nvdisasm failed on `{}`: {}",
            cubin.file,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let listing = String::from_utf8_lossy(&out.stdout);
    let section = function_section(&listing, kernel).ok_or_else(|| {
        anyhow!(
            "nvdisasm's listing of `{}` ({}) has no `.text.{kernel}` section",
            cubin.file,
            cubin.arch
        )
    })?;
    Ok(section.to_string())
}

/// The part of an nvdisasm listing that is `kernel`'s: its `//---- .text.<kernel> ----` header line (where nvdisasm
/// printed one), its section and code, up to the next kernel's header or section.
fn function_section<'a>(listing: &'a str, kernel: &str) -> Option<&'a str> {
    let label = format!(".text.{kernel}:");
    let at = listing.find(&label)?;
    // This kernel's header: the last `//---` line before its label that names its section.
    let named = |l: &str| {
        l.starts_with("//-") && l.split_whitespace().any(|w| w == format!(".text.{kernel}"))
    };
    let start = listing[..at]
        .rfind("\n//-")
        .map(|i| i + 1)
        .filter(|&i| named(listing[i..].lines().next().unwrap_or("")))
        .unwrap_or(at);
    let rest = &listing[at + label.len()..];
    let end = [rest.find("\n//-"), rest.find(".section")]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(rest.len());
    Some(&listing[start..at + label.len() + end])
}

/// Counts opcodes in a SASS listing: lines like `/*0040*/  @!P0 HMMA.16816.F32 R4, R8, ... ;`.
pub fn parse_sass(listing: &str) -> BTreeMap<String, usize> {
    let mut h = BTreeMap::new();
    for line in listing.lines() {
        let Some(rest) = line
            .trim()
            .strip_prefix("/*")
            .and_then(|l| l.split_once("*/"))
            .map(|(_, r)| r.trim())
        else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let Some(mut op) = words.next() else { continue };
        if op.starts_with('@') {
            op = match words.next() {
                Some(o) => o,
                None => continue,
            };
        }
        let base = op.split('.').next().unwrap_or(op).trim_end_matches(';');
        if base
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
            && !base.is_empty()
        {
            *h.entry(base.to_string()).or_insert(0) += 1;
        }
    }
    h
}

/// The SASS opcode histogram of one kernel on every architecture it is built for, as a table to review on
/// diff (blocks commit it as an insta snapshot). Local-memory traffic (LDL / STL) is an error.
pub fn table(spec: &crate::KernelSpec) -> Result<String> {
    // Per architecture: the opcode histogram, and the hot loop (a schedule change that leaves the histogram
    // nearly alone — a wait hoisted, a value rebuilt in the loop instead of kept — shows there, where it costs).
    let mut cols = Vec::new();
    let mut hot = Vec::new();
    for &arch in spec.archs {
        let (cubin, _) = spec.compile(arch)?;
        cols.push((arch, histogram(&cubin, spec.name)?));
        hot.push((
            arch,
            parse_hot_loop(&disassemble(&cubin, spec.name, &["-hex"])?),
        ));
    }
    let mut ops: Vec<&String> = cols.iter().flat_map(|(_, h)| h.keys()).collect();
    ops.sort();
    ops.dedup();
    let mut s = format!(
        "SASS opcodes of {} (nvdisasm; modifiers dropped)\n",
        spec.name
    );
    s.push_str(&format!("{:<10}", "opcode"));
    for (arch, _) in &cols {
        s.push_str(&format!("{:>8}", arch.name()));
    }
    s.push('\n');
    for op in ops {
        s.push_str(&format!("{op:<10}"));
        for (_, h) in &cols {
            s.push_str(&format!("{:>8}", h.get(op).copied().unwrap_or(0)));
        }
        s.push('\n');
    }
    if s.lines()
        .any(|l| l.starts_with("LDL ") || l.starts_with("STL "))
    {
        bail!("{} uses local memory:\n{s}", spec.name);
    }
    s.push_str(
        "hot loop (the innermost with tensor-core instructions; ptxas's encoded stall cycles)\n",
    );
    for (arch, h) in hot {
        s.push_str(&format!("{:<10}", arch.name()));
        match h {
            Some(h) => s.push_str(&format!(
                "{} instructions, {} tensor-core, {} stall cycles\n",
                h.instructions, h.mma, h.stall_cycles
            )),
            None => s.push_str("none\n"),
        }
    }
    Ok(s)
}

/// A loop of a kernel's SASS: from a label to the backward branch to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotLoop {
    pub start: u32,
    pub end: u32,
    pub instructions: usize,
    /// Tensor-core instructions (HMMA, IMMA, DMMA, and the wgmma forms HGMMA, QGMMA, IGMMA, BGMMA).
    pub mma: usize,
    pub stall_cycles: u32,
}

/// The innermost loop with tensor-core instructions in an `nvdisasm -hex` listing (the fewest instructions among
/// the loops that have any), or None.
pub fn parse_hot_loop(listing: &str) -> Option<HotLoop> {
    let code = parse_controlled(listing);
    let mut labels: BTreeMap<String, u32> = BTreeMap::new();
    let mut pending: Vec<String> = Vec::new();
    for line in listing.lines() {
        let t = line.trim();
        if let Some(l) = t.strip_suffix(':').filter(|l| l.starts_with('.')) {
            pending.push(l.to_string());
            continue;
        }
        let addr = t
            .strip_prefix("/*")
            .and_then(|r| r.split_once("*/"))
            .filter(|(_, body)| body.contains(';'))
            .and_then(|(a, _)| u32::from_str_radix(a, 16).ok());
        if let Some(a) = addr {
            for p in pending.drain(..) {
                labels.insert(p, a);
            }
        }
    }
    let is_mma = |op: &str| {
        matches!(
            op,
            "HMMA" | "IMMA" | "DMMA" | "HGMMA" | "QGMMA" | "IGMMA" | "BGMMA"
        )
    };
    code.iter()
        .filter(|i| i.opcode() == "BRA")
        .filter_map(|b| {
            let (_, rest) = b.text.split_once("`(")?;
            let start = *labels.get(rest.split_once(')')?.0)?;
            (start <= b.address).then_some((start, b.address))
        })
        .filter_map(|(start, end)| {
            let body: Vec<&Controlled> = code
                .iter()
                .filter(|i| (start..=end).contains(&i.address))
                .collect();
            let mma = body.iter().filter(|i| is_mma(i.opcode())).count();
            (mma > 0).then(|| HotLoop {
                start,
                end,
                instructions: body.len(),
                mma,
                stall_cycles: body.iter().map(|i| u32::from(i.control.stall)).sum(),
            })
        })
        .min_by_key(|h| (h.instructions, h.start))
}

/// The hot loop's schedule: its instructions' mnemonics with their modifiers and guards (`@P0 BRA`, `FMNMX.NAN`,
/// `QGMMA.64x224x32.F32.E4M3.E4M3`), registers and operands left out, in address order. Two builds whose loops
/// ptxas scheduled alike give the same sequence whatever registers they got; ptxas reschedules a tight loop for
/// changes anywhere in the kernel (six unread parameters moved 81 of stage 7's 1023 loop instructions and cost 0.9%
/// of its cycles: docs/decisions.md), so comparing sequences tells a change from a new schedule.
pub fn hot_loop_schedule(listing: &str) -> Option<(HotLoop, Vec<String>)> {
    let h = parse_hot_loop(listing)?;
    let ops = parse_controlled(listing)
        .iter()
        .filter(|i| (h.start..=h.end).contains(&i.address))
        .map(|i| {
            let t = i.text.trim();
            let (guard, rest) = match t.strip_prefix('@') {
                Some(r) => {
                    let (g, rest) = r.split_once(' ').unwrap_or((r, ""));
                    (format!("@{g} "), rest.trim_start())
                }
                None => (String::new(), t),
            };
            let mnemonic = rest
                .split_whitespace()
                .next()
                .unwrap_or("")
                .trim_end_matches(';');
            format!("{guard}{mnemonic}")
        })
        .collect();
    Some((h, ops))
}

/// FNV-1a (64-bit) of a schedule, one line per instruction: a short name for it in reports.
pub fn schedule_fingerprint(ops: &[String]) -> u64 {
    ops.iter()
        .flat_map(|o| o.bytes().chain(std::iter::once(b'\n')))
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// The scheduling metadata ptxas puts in the top 23 bits of every 128-bit instruction (sm_70 and later; the
/// layout as Jia et al. measured it on Volta, "Dissecting the NVIDIA Volta GPU Architecture via
/// Microbenchmarking", 2018, and as it decodes consistently on sm_90 listings): from bit 105 up, stall cycles
/// (4 bits), the yield bit, the write and read dependency barrier (3 bits each, 7 = none), the mask of barriers
/// waited on (6 bits) and the operand reuse flags (4 bits). The stall count is what ncu reports as `wait`: cycles
/// the warp may not issue after this instruction, set by ptxas for fixed-latency dependencies and pipe rates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Control {
    pub stall: u8,
    pub yield_bit: bool,
    pub write_barrier: Option<u8>,
    pub read_barrier: Option<u8>,
    pub wait_mask: u8,
    pub reuse: u8,
}

impl Control {
    /// From the instruction's high 64-bit word (the second hex word nvdisasm -hex prints).
    pub fn from_high_word(h: u64) -> Control {
        let bar = |v: u64| (v != 7).then_some(v as u8);
        Control {
            stall: ((h >> 41) & 0xf) as u8,
            yield_bit: (h >> 45) & 1 == 1,
            write_barrier: bar((h >> 46) & 7),
            read_barrier: bar((h >> 49) & 7),
            wait_mask: ((h >> 52) & 0x3f) as u8,
            reuse: ((h >> 58) & 0xf) as u8,
        }
    }
}

/// CuAssembler's notation: `[B--2---:R-:W1:Y:S04]` (barriers waited on, read and write barrier, the yield bit
/// as encoded, stall cycles).
impl std::fmt::Display for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mask: String = (0..6)
            .map(|b| {
                if self.wait_mask >> b & 1 == 1 {
                    char::from(b'0' + b)
                } else {
                    '-'
                }
            })
            .collect();
        let bar = |b: Option<u8>| b.map_or("-".to_string(), |v| v.to_string());
        write!(
            f,
            "[B{mask}:R{}:W{}:{}:S{:02}]",
            bar(self.read_barrier),
            bar(self.write_barrier),
            if self.yield_bit { 'Y' } else { '-' },
            self.stall
        )
    }
}

/// One instruction of a `controlled` listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Controlled {
    pub address: u32,
    /// The instruction as nvdisasm prints it, predicate included, without the trailing `;`.
    pub text: String,
    pub control: Control,
}

impl Controlled {
    /// The base opcode (`FMNMX.NAN` → `FMNMX`), past any predicate.
    pub fn opcode(&self) -> &str {
        let t = self.text.trim_start();
        let t = if t.starts_with('@') {
            t.split_once(' ').map_or("", |(_, r)| r.trim_start())
        } else {
            t
        };
        t.split(|c: char| c == '.' || c.is_whitespace())
            .next()
            .unwrap_or("")
    }
}

/// Pairs each instruction line of an `nvdisasm -hex` listing with the next line's encoding word (the high half).
pub fn parse_controlled(listing: &str) -> Vec<Controlled> {
    let hex = |l: &str| -> Option<u64> {
        let a = l.rfind("/* 0x")? + 5;
        let b = a + l[a..].find(' ')?;
        u64::from_str_radix(&l[a..b], 16).ok()
    };
    let lines: Vec<&str> = listing.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        let Some(rest) = t.strip_prefix("/*") else {
            continue;
        };
        let Some((addr, body)) = rest.split_once("*/") else {
            continue;
        };
        let Ok(address) = u32::from_str_radix(addr, 16) else {
            continue;
        };
        let Some(semi) = body.find(';') else { continue };
        let Some(h) = lines.get(i + 1).and_then(|n| hex(n)) else {
            continue;
        };
        out.push(Controlled {
            address,
            text: body[..semi].trim().to_string(),
            control: Control::from_high_word(h),
        });
    }
    out
}

/// Instructions and encoded stall cycles of one opcode over an address range of a `controlled` listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpcodeStalls {
    pub opcode: String,
    pub instructions: usize,
    pub stall_cycles: u32,
}

/// The stall cycles of `code`'s instructions at `addresses`, per opcode, most first (ties by name).
pub fn stalls_by_opcode(code: &[Controlled], addresses: std::ops::Range<u32>) -> Vec<OpcodeStalls> {
    let mut per: BTreeMap<&str, (usize, u32)> = BTreeMap::new();
    for i in code.iter().filter(|i| addresses.contains(&i.address)) {
        let e = per.entry(i.opcode()).or_default();
        e.0 += 1;
        e.1 += u32::from(i.control.stall);
    }
    let mut rows: Vec<OpcodeStalls> = per
        .into_iter()
        .map(|(op, (n, st))| OpcodeStalls {
            opcode: op.to_string(),
            instructions: n,
            stall_cycles: st,
        })
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.stall_cycles));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_base_opcodes_predicated_or_not() {
        let l = "        /*0040*/                   HMMA.16816.F32 R4, R8, R12, R4 ;    /* 0x... */\n\
                 /*0050*/               @!P0 BRA 0x60 ;\n\
                 /*0060*/                   LDSM.16.M88.4 R8, [R2] ;\n\
                 /*0070*/                   HMMA.16816.F32 R4, R8, R12, R4 ;\n\
                 .text.hello:";
        let h = parse_sass(l);
        assert_eq!(h.get("HMMA"), Some(&2));
        assert_eq!((h.get("BRA"), h.get("LDSM")), (Some(&1), Some(&1)));
        assert_eq!(h.len(), 3);
    }

    #[test]
    fn the_hot_loop_is_the_innermost_with_tensor_core_instructions() {
        // An outer loop (.L_x_0 .. 0x70) around an inner one (.L_x_1 .. 0x50) that holds the QGMMA, and a
        // spin loop (.L_x_2) with none. Stall counts 1, 2, 3, … from the high words' bits 41..44.
        let w = |stall: u64| format!("/* 0x{:016x} */", stall << 41);
        let ins = |a: u32, t: &str, st: u64| {
            format!("        /*{a:04x}*/ {t} ;  /* 0x0 */\n        {}\n", w(st))
        };
        let l = [
            ".L_x_0:\n".to_string(),
            ins(0x10, "IMAD R1, R2, R3, RZ", 1),
            ".L_x_1:\n".to_string(),
            ins(0x20, "QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], RZ", 2),
            ins(0x30, "WARPGROUP.DEPBAR.LE gsb0, 0x0", 3),
            ins(0x40, "FADD R1, R1, R2", 4),
            ins(0x50, "@P0 BRA `(.L_x_1)", 5),
            ins(0x60, "HMMA.16816.F32 R4, R8, R12, R4", 1),
            ins(0x70, "@P1 BRA `(.L_x_0)", 1),
            ".L_x_2:\n".to_string(),
            ins(0x80, "@!P2 BRA `(.L_x_2)", 1),
        ]
        .concat();
        let h = parse_hot_loop(&l).expect("a loop");
        assert_eq!(
            (h.start, h.end, h.instructions, h.mma, h.stall_cycles),
            (0x20, 0x50, 4, 1, 14)
        );
        assert_eq!(parse_hot_loop(&ins(0x10, "BRA `(.L_x_9)", 1)), None);
    }

    #[test]
    fn the_hot_loop_schedule_ignores_registers_and_sees_order() {
        let w = |stall: u64| format!("/* 0x{:016x} */", stall << 41);
        let ins =
            |a: u32, t: &str| format!("        /*{a:04x}*/ {t} ;  /* 0x0 */\n        {}\n", w(1));
        let listing = |body: [&str; 3]| {
            [
                ".L_x_1:\n".to_string(),
                ins(0x20, body[0]),
                ins(0x30, body[1]),
                ins(0x40, body[2]),
                ins(0x50, "@P0 BRA `(.L_x_1)"),
            ]
            .concat()
        };
        let a = listing([
            "QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], RZ",
            "FMNMX.NAN R1, R2, R3, !PT",
            "FADD R1, R1, R2",
        ]);
        let (h, ops) = hot_loop_schedule(&a).expect("a loop");
        assert_eq!((h.start, h.end), (0x20, 0x50));
        assert_eq!(
            ops,
            [
                "QGMMA.64x128x32.F32.E4M3.E4M3",
                "FMNMX.NAN",
                "FADD",
                "@P0 BRA"
            ]
        );
        // Other registers, the same schedule; two instructions swapped, another.
        let renamed = listing([
            "QGMMA.64x128x32.F32.E4M3.E4M3 R40, gdesc[UR8], RZ",
            "FMNMX.NAN R7, R5, R9, !PT",
            "FADD R7, R7, R5",
        ]);
        let swapped = listing([
            "QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], RZ",
            "FADD R1, R1, R2",
            "FMNMX.NAN R1, R2, R3, !PT",
        ]);
        let fp = |l: &str| schedule_fingerprint(&hot_loop_schedule(l).expect("a loop").1);
        assert_eq!(fp(&a), fp(&renamed));
        assert_ne!(fp(&a), fp(&swapped));
    }

    #[test]
    fn control_codes_decode_from_the_high_word() {
        // From stage 6's SASS (nvdisasm 13, sm_90a): a stall of 2, the yield bit, no barrier.
        let c = Control::from_high_word(0x000fe4000001ff00);
        let none = Control {
            stall: 2,
            yield_bit: true,
            write_barrier: None,
            read_barrier: None,
            wait_mask: 0,
            reuse: 0,
        };
        assert_eq!(c, none);
        assert_eq!(c.to_string(), "[B------:R-:W-:Y:S02]");
        // Every field at a distinct value, placed bit by bit: stall 5, no yield, write barrier 1, read barrier 3,
        // waits on barriers 0 and 4, reuse 0b1010.
        let h = (5u64 << 41) | (1 << 46) | (3 << 49) | (0b010001 << 52) | (0b1010 << 58);
        let c = Control::from_high_word(h);
        let all = Control {
            stall: 5,
            yield_bit: false,
            write_barrier: Some(1),
            read_barrier: Some(3),
            wait_mask: 0b010001,
            reuse: 0b1010,
        };
        assert_eq!(c, all);
        assert_eq!(c.to_string(), "[B0---4-:R3:W1:-:S05]");
    }

    #[test]
    fn controlled_listing_pairs_instructions_with_their_encodings() {
        let l = "        /*1600*/                   FMNMX.NAN R15, R13, R10, !PT ;   /* 0x0000000a0d0f7209 */\n\
                                                                             /* 0x004fc80007820000 */\n\
                 /*1660*/               @P0 MUFU.EX2 R40, R40 ;                  /* 0x0000002800287308 */\n\
                                                                             /* 0x000fe60000000800 */\n\
                 .L_x_3:\n";
        let v = parse_controlled(l);
        assert_eq!(v.len(), 2);
        assert_eq!(
            (v[0].address, v[0].opcode(), v[0].control.stall),
            (0x1600, "FMNMX", 4)
        );
        // Stage 6's row max waiting on barrier 2 (a shuffle's result) before its 4-cycle stall.
        assert_eq!(v[0].control.to_string(), "[B--2---:R-:W-:-:S04]");
        assert_eq!(
            (v[1].opcode(), v[1].text.as_str()),
            ("MUFU", "@P0 MUFU.EX2 R40, R40")
        );
        assert_eq!(
            (v[1].address, v[1].control.stall, v[1].control.wait_mask),
            (0x1660, 3, 0)
        );
        let all = stalls_by_opcode(&v, 0..u32::MAX);
        assert_eq!(
            all.iter()
                .map(|r| (r.opcode.as_str(), r.instructions, r.stall_cycles))
                .collect::<Vec<_>>(),
            [("FMNMX", 1, 4), ("MUFU", 1, 3)]
        );
        assert_eq!(stalls_by_opcode(&v, 0x1610..0x2000).len(), 1);
    }

    #[test]
    fn a_kernels_section_has_its_own_header_and_not_the_next() {
        let listing = "\t.headerflags\n//--------------------- .text.k1 --------------------------\n\t.section\t.text.k1,\"ax\"\n.text.k1:\n        /*0000*/ EXIT ;\n//--------------------- .text.k2 --------------------------\n\t.section\t.text.k2,\"ax\"\n.text.k2:\n        /*0000*/ NOP ;\n";
        let k1 = function_section(listing, "k1").unwrap();
        assert!(k1.starts_with("//--------------------- .text.k1 "), "{k1}");
        assert!(
            k1.contains("EXIT") && !k1.contains("k2") && !k1.contains("NOP"),
            "{k1}"
        );
        let k2 = function_section(listing, "k2").unwrap();
        assert!(
            k2.starts_with("//--------------------- .text.k2 ") && k2.contains("NOP"),
            "{k2}"
        );
    }
}
