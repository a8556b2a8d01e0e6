// `cargo xtask layouts`: every fragment layout the lab knows, as drawings, JSON, or SVG pictures.
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use frag_layout::{ARCHS, LAYOUTS, Record, catalogue, smem_catalogue, smem_layouts, smem_svg, svg};

pub fn run(json: bool, svg_dir: Option<&Path>) -> Result<bool> {
    if json {
        let records: Vec<Record> = catalogue();
        // Fragments (register layouts) and wgmma's shared-memory operand layouts.
        let all = serde_json::json!({ "fragments": records, "smem": smem_catalogue() });
        // A closed pipe (`| head`) ends the output quietly.
        let _ = writeln!(std::io::stdout(), "{all}");
    }
    if let Some(dir) = svg_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut n = 0;
        for arch in ARCHS {
            for id in LAYOUTS.iter().filter(|l| l.exists_on(arch)) {
                let path = dir.join(format!("{}__{}.svg", arch.name(), id.key()));
                std::fs::write(&path, svg(&id.model()))?;
                n += 1;
            }
        }
        for id in smem_layouts() {
            std::fs::write(
                dir.join(format!("sm_90a__{}.svg", id.key())),
                smem_svg(&id.model()),
            )?;
            n += 1;
        }
        eprintln!("{n} pictures written to {}", dir.display());
    }
    if !json && svg_dir.is_none() {
        for arch in ARCHS {
            for id in LAYOUTS.iter().filter(|l| l.exists_on(arch)) {
                let source = if frag_layout::is_probed(arch) {
                    "probed"
                } else {
                    "model"
                };
                println!("[{arch}, source: {source}] {}", id.model().draw());
            }
        }
        for id in smem_layouts() {
            println!("[sm_90a, source: probed] {}", id.model().draw());
        }
    }
    Ok(true)
}
