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
    let dir = std::env::temp_dir().join(format!("lab-sass-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // One file per call: tests of one process disassemble the same kernel concurrently (its compile test
    // checks the SASS it requires while its snapshot test tables it), and must not share a path.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("{}-{}-{kernel}-{n}.cubin", cubin.file, cubin.arch));
    std::fs::write(&path, &cubin.image)?;
    let out = Command::new(nvdisasm()?)
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

/// The part of an nvdisasm listing that is `kernel`'s code: from its `.text.<kernel>:` label to the next
/// section.
fn function_section<'a>(listing: &'a str, kernel: &str) -> Option<&'a str> {
    let label = format!(".text.{kernel}:");
    let start = listing.find(&label)? + label.len();
    let rest = &listing[start..];
    let end = rest.find(".section").unwrap_or(rest.len());
    Some(&rest[..end])
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
    let mut cols = Vec::new();
    for &arch in spec.archs {
        let (cubin, _) = spec.compile(arch)?;
        cols.push((arch, histogram(&cubin, spec.name)?));
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
    Ok(s)
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
}
