// checks.rs: a kernel's build against its commitments: budget, ptxas's performance warnings, required SASS.
//
// Sits above `compile` and `sass` (it needs a cubin and its disassembly), so that neither imports the other's way.
use anyhow::{Result, anyhow};

use crate::compile::{Arch, Cubin, KernelSpec};
use crate::resources::Resources;

impl KernelSpec {
    /// Compiles and checks the budget, the ptxas warnings and the SASS the kernel must contain; the error lists
    /// every violation.
    pub fn check_budget(&self, arch: Arch) -> Result<Resources> {
        let (cubin, r) = self.compile(arch)?;
        let v = self.violations(&cubin, &r)?;
        if v.is_empty() {
            Ok(r)
        } else {
            Err(anyhow!(
                "{}/{} on {arch} breaks its budget: {}",
                self.block,
                self.name,
                v.join("; ")
            ))
        }
    }

    /// Every way this kernel's build breaks its commitments: the budget (registers, shared memory, no stack,
    /// no spills), ptxas's performance warnings, and the SASS opcodes it exists to use.
    pub fn violations(&self, cubin: &Cubin, r: &Resources) -> Result<Vec<String>> {
        let mut v = self.budget.violations(r);
        v.extend(cubin.warnings(self.name).into_iter().map(|w| {
            let why = if w.contains("C7512") || w.contains("C7515") {
                " (wgmma serialised: a silent slowdown)"
            } else if w.contains("C7508") {
                " (setmaxnreg ignored: it needs __launch_bounds__(threads, 1) and one branch per role)"
            } else {
                ""
            };
            format!("ptxas warning: {w}{why}")
        }));
        if !self.sass.is_empty() {
            let h = crate::sass::histogram(cubin, self.name)?;
            for op in self.sass {
                if !h.contains_key(*op) {
                    let mut have: Vec<&String> = h.keys().collect();
                    have.retain(|k| {
                        k.contains("MMA") || k.starts_with("UTMA") || k.starts_with("SYNCS")
                    });
                    v.push(format!(
                        "SASS has no {op} (the kernel exists to use it); its MMA/TMA/SYNCS opcodes: {have:?}"
                    ));
                }
            }
        }
        Ok(v)
    }
}
