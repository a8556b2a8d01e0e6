// `cargo xtask ptxas`: every kernel for every architecture, its ptxas resources, and the budget check.
use std::collections::HashMap;

use anyhow::Result;
use lab::{Arch, Cubin};

use crate::registry::all_kernels;

pub fn run(archs: &[String], check: bool, only: &[String]) -> Result<bool> {
    let archs: Vec<Arch> = if archs.is_empty() {
        // Hopper-only kernels (wgmma, setmaxnreg) are built for sm_90a alone, so it is checked too.
        let mut a = Arch::REQUIRED.to_vec();
        a.push(Arch::Sm90a);
        a
    } else {
        archs
            .iter()
            .map(|a| Arch::parse(a))
            .collect::<Result<_>>()?
    };
    let kernels: Vec<_> = all_kernels()
        .into_iter()
        .filter(|k| only.is_empty() || only.iter().any(|o| k.name.contains(o.as_str())))
        .collect();
    // One compile per (source, arch): a source may define several kernels.
    let mut cubins: HashMap<(&str, Arch), std::result::Result<std::sync::Arc<Cubin>, String>> =
        HashMap::new();
    println!(
        "| block | kernel | arch | regs | smem B | barriers | stack B | spill st/ld B | budget regs/smem | SASS required | status |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let (mut failures, mut rows) = (0usize, 0usize);
    for k in &kernels {
        for &arch in archs.iter().filter(|a| k.archs.contains(a)) {
            rows += 1;
            let c = cubins
                .entry((k.source.file, arch))
                .or_insert_with(|| lab::compile(k.source, arch, &[]).map_err(|e| format!("{e:#}")));
            let budget = format!("{}/{}", k.budget.max_registers, k.budget.max_smem_bytes);
            let r = match c
                .as_ref()
                .map_err(|e| e.clone())
                .and_then(|c| c.kernel(k.name).map_err(|e| format!("{e:#}")))
            {
                Ok(r) => r.clone(),
                Err(e) => {
                    failures += 1;
                    println!(
                        "| {} | {} | {arch} | | | | | | {budget} | | COMPILE ERROR |",
                        k.block, k.name
                    );
                    eprintln!("{e}");
                    continue;
                }
            };
            let cubin = c.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
            let v = k.violations(cubin, &r)?;
            let status = if v.is_empty() {
                "ok".to_string()
            } else {
                format!("OVER: {}", v.join("; "))
            };
            if !v.is_empty() && check {
                failures += 1;
            }
            println!(
                "| {} | {} | {arch} | {} | {} | {} | {} | {}/{} | {budget} | {} | {status} |",
                k.block,
                k.name,
                r.registers,
                r.smem_bytes,
                r.barriers,
                r.stack_bytes,
                r.spill_stores,
                r.spill_loads,
                k.sass.join(" ")
            );
        }
    }
    println!(
        "\nptxas: {rows} kernel builds, {failures} failing{}",
        if check { " (budgets checked)" } else { "" }
    );
    Ok(failures == 0)
}

/// `cargo xtask sass KERNEL [--control [--range A..B] | --loop]`: the kernel's disassembly on stdout, or with each
/// instruction's control code and the stall cycles per opcode, or its hot loop's schedule.
pub fn sass(
    kernel: &str,
    arch: Option<&str>,
    control: bool,
    range: Option<&str>,
    hot_loop: bool,
) -> Result<bool> {
    let specs = all_kernels();
    let Some(spec) = specs.iter().find(|s| s.name == kernel) else {
        let names: Vec<&str> = specs.iter().map(|s| s.name).collect();
        anyhow::bail!("no kernel named `{kernel}`; known: {}", names.join(", "));
    };
    let arch = match arch {
        Some(a) => Arch::parse(a)?,
        None => spec.archs[0],
    };
    let (cubin, _) = spec.compile(arch)?;
    if hot_loop {
        let (h, ops) = lab::sass::hot_loop(&cubin, kernel)?
            .ok_or_else(|| anyhow::anyhow!("{kernel}: no loop with tensor-core instructions"))?;
        println!(
            "{kernel} ({arch}) hot loop {:#x}..={:#x}: {} instructions, {} tensor-core, {} stall cycles, schedule {:016x}",
            h.start,
            h.end,
            h.instructions,
            h.mma,
            h.stall_cycles,
            lab::sass::schedule_fingerprint(&ops)
        );
        for op in ops {
            println!("{op}");
        }
        return Ok(true);
    }
    if !control {
        print!("{}", lab::sass::listing(&cubin, kernel)?);
        return Ok(true);
    }
    let (lo, hi) = match range {
        Some(r) => parse_range(r)?,
        None => (0, u32::MAX),
    };
    let code = lab::sass::controlled(&cubin, kernel)?;
    for i in &code {
        println!("/*{:05x}*/ {} {}", i.address, i.control, i.text);
    }
    let rows = lab::sass::stalls_by_opcode(&code, lo..hi);
    let n: usize = rows.iter().map(|r| r.instructions).sum();
    let total: u32 = rows.iter().map(|r| r.stall_cycles).sum();
    println!("\nstall cycles by opcode, {n} instructions in {lo:#x}..{hi:#x}: {total} in all");
    println!("| opcode | instructions | stall cycles | per instruction |\n|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.2} |",
            r.opcode,
            r.instructions,
            r.stall_cycles,
            f64::from(r.stall_cycles) / r.instructions as f64
        );
    }
    Ok(true)
}

/// `START..END` in hex (with or without 0x).
fn parse_range(r: &str) -> Result<(u32, u32)> {
    let hex = |s: &str| u32::from_str_radix(s.trim().trim_start_matches("0x"), 16);
    let (a, b) = r.split_once("..").ok_or_else(|| {
        anyhow::anyhow!("--range `{r}`: expected START..END in hex, e.g. 0xc40..0x5000")
    })?;
    let (a, b) = (
        hex(a).map_err(|e| anyhow::anyhow!("--range `{r}`: start: {e}"))?,
        hex(b).map_err(|e| anyhow::anyhow!("--range `{r}`: end: {e}"))?,
    );
    anyhow::ensure!(a < b, "--range `{r}`: the start must come before the end");
    Ok((a, b))
}

#[cfg(test)]
mod range_tests {
    use super::parse_range;

    #[test]
    fn ranges_parse_in_hex_and_refuse_by_name() {
        assert_eq!(parse_range("0xc40..0x5000").unwrap(), (0xc40, 0x5000));
        assert_eq!(parse_range("c40..5000").unwrap(), (0xc40, 0x5000));
        for bad in ["c40", "5000..c40", "xyz..10"] {
            assert!(
                parse_range(bad)
                    .unwrap_err()
                    .to_string()
                    .contains("--range"),
                "{bad}"
            );
        }
    }
}
