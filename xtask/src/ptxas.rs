// `cargo xtask ptxas`: every kernel for every architecture, its ptxas resources, and the budget check.
use std::collections::HashMap;

use anyhow::Result;
use lab::{Arch, Cubin};

use crate::registry::all_kernels;

pub fn run(archs: &[String], check: bool) -> Result<bool> {
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
    let kernels = all_kernels();
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

/// `cargo xtask sass KERNEL`: the kernel's disassembly on stdout.
pub fn sass(kernel: &str, arch: Option<&str>) -> Result<bool> {
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
    print!("{}", lab::sass::listing(&cubin, kernel)?);
    Ok(true)
}
