// Typed ptxas resource reports, parsed from NVRTC's `-Xptxas -v` log, and the budgets they are checked against.
use std::fmt;

use serde::Serialize;

/// What ptxas says one entry function uses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Resources {
    pub kernel: String,
    pub arch: String,
    pub registers: u32,
    pub barriers: u32,
    /// Static shared memory in bytes (dynamic shared memory is a launch parameter, not in the report).
    pub smem_bytes: u32,
    pub stack_bytes: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub cmem0_bytes: u32,
}

/// Limits a block commits to for one kernel. Spills and stack are always held to zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub max_registers: u32,
    pub max_smem_bytes: u32,
}

impl Budget {
    pub const fn new(max_registers: u32, max_smem_bytes: u32) -> Self {
        Budget {
            max_registers,
            max_smem_bytes,
        }
    }

    /// Every way `r` breaks the budget, in words a reviewer can act on; empty when it fits.
    pub fn violations(&self, r: &Resources) -> Vec<String> {
        let mut v = Vec::new();
        if r.registers > self.max_registers {
            v.push(format!(
                "{} registers > budget {}",
                r.registers, self.max_registers
            ));
        }
        if r.smem_bytes > self.max_smem_bytes {
            v.push(format!(
                "{} B shared memory > budget {}",
                r.smem_bytes, self.max_smem_bytes
            ));
        }
        if r.spill_stores + r.spill_loads > 0 {
            v.push(format!(
                "spills: {} B stored, {} B loaded (budget 0)",
                r.spill_stores, r.spill_loads
            ));
        }
        if r.stack_bytes > 0 {
            v.push(format!(
                "{} B stack frame (budget 0: a register array went to local memory?)",
                r.stack_bytes
            ));
        }
        v
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} [{}]: {} regs, {} B smem, {} barriers, {} B stack, {}/{} B spill st/ld",
            self.kernel,
            self.arch,
            self.registers,
            self.smem_bytes,
            self.barriers,
            self.stack_bytes,
            self.spill_stores,
            self.spill_loads
        )
    }
}

/// The first unsigned integer in `s` before `unit`, e.g. `number_before("12 bytes smem", "bytes smem")`.
fn number_before(s: &str, unit: &str) -> Option<u32> {
    let at = s.find(unit)?;
    s[..at]
        .split(|c: char| !c.is_ascii_digit())
        .rev()
        .find(|t| !t.is_empty())?
        .parse()
        .ok()
}

fn quoted(s: &str) -> Vec<&str> {
    s.split('\'').skip(1).step_by(2).collect()
}

/// Parses every entry function's report. ptxas prints, per kernel:
/// `Compiling entry function 'k' for 'sm_90'`, then `Function properties for k` followed by a line of stack
/// and spill figures, then `Used N registers, used M barriers, X bytes smem, ...`.
pub fn parse_ptxas_log(log: &str) -> Vec<Resources> {
    let mut out: Vec<Resources> = Vec::new();
    let mut props_for: Option<String> = None;
    for line in log.lines() {
        let line = line.trim();
        if line.contains("Compiling entry function") {
            let q = quoted(line);
            if let (Some(k), Some(a)) = (q.first(), q.get(1)) {
                out.push(Resources {
                    kernel: (*k).into(),
                    arch: (*a).into(),
                    ..Default::default()
                });
            }
            props_for = None;
        } else if line.contains("Function properties for") {
            props_for = line
                .rsplit("Function properties for")
                .next()
                .map(|s| s.trim().to_string());
        } else if line.contains("bytes stack frame") {
            if let Some(r) = props_for
                .as_ref()
                .and_then(|k| out.iter_mut().rev().find(|r| &r.kernel == k))
            {
                r.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
                r.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                r.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            }
        } else if line.contains("Used")
            && line.contains("registers")
            && let Some(r) = out.last_mut()
        {
            r.registers = number_before(line, "registers").unwrap_or(0);
            r.barriers = number_before(line, "barriers").unwrap_or(0);
            r.smem_bytes = number_before(line, "bytes smem").unwrap_or(0);
            r.cmem0_bytes = number_before(line, "bytes cmem[0]").unwrap_or(0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'tile_kernel' for 'sm_90'
ptxas info    : Function properties for tile_kernel
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 72 registers, used 1 barriers, 4096 bytes smem, 392 bytes cmem[0]
ptxas info    : Compiling entry function 'hello' for 'sm_90'
ptxas info    : Function properties for hello
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, 380 bytes cmem[0]
";

    #[test]
    fn parses_every_entry_with_its_own_figures() {
        let r = parse_ptxas_log(LOG);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            Resources {
                kernel: "tile_kernel".into(),
                arch: "sm_90".into(),
                registers: 72,
                barriers: 1,
                smem_bytes: 4096,
                stack_bytes: 8,
                spill_stores: 4,
                spill_loads: 12,
                cmem0_bytes: 392,
            }
        );
        assert_eq!(
            (
                r[1].registers,
                r[1].barriers,
                r[1].smem_bytes,
                r[1].stack_bytes
            ),
            (10, 0, 0, 0)
        );
    }

    #[test]
    fn budget_names_each_violation() {
        let r = &parse_ptxas_log(LOG)[0];
        let v = Budget::new(64, 2048).violations(r);
        assert_eq!(v.len(), 4, "{v:?}");
        assert!(v[0].contains("72 registers > budget 64"));
        assert!(
            Budget::new(72, 4096)
                .violations(&parse_ptxas_log(LOG)[1])
                .is_empty()
        );
    }
}
