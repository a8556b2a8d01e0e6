// The kernels each stage's calls can launch, which `Attention::warm` loads ahead of the first call.
use composed::Stage;

/// The kernels a call of `stage` at head dimension `d` can launch (`Attention::warm` loads them).
pub(crate) fn warm_list(stage: Stage, d: usize) -> Vec<lab::KernelSpec> {
    let mut list = vec![stage.kernel(d)];
    if stage.tma() {
        let merge = format!("stage7_merge_d{d}");
        list.extend(
            composed::KERNELS
                .iter()
                .filter(|k| k.name == merge)
                .copied(),
        );
    }
    if stage.reads_vt() {
        list.extend([composed::TRANSPOSE_V, composed::VT_TILES]);
    }
    if stage.transposes_v() {
        let plan = composed::ragged::Planner::default();
        list.extend([
            composed::varlen_kernel(d),
            plan.histogram,
            plan.offsets,
            plan.scatter,
            // Split-KV (decode over a few long sequences): the virtual batch's prep and the parts' merge.
            composed::split_kv::prep_kernel(),
            composed::split_kv::merge_kernel(d),
        ]);
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_loads_what_each_stage_launches() {
        let names = |stage, d| -> Vec<String> {
            warm_list(stage, d)
                .iter()
                .map(|k| k.name.to_string())
                .collect()
        };
        assert_eq!(
            names(Stage::S7, 128),
            [
                "stage7_d128",
                "stage7_merge_d128",
                "prep_vt",
                "prep_vt_tiles"
            ]
        );
        let eight = names(Stage::S8, 64);
        assert!(
            eight.contains(&"stage8_d64".to_string())
                && eight.contains(&"stage8_varlen_d64".to_string())
                && eight.contains(&"stage7_merge_d64".to_string())
                && eight.contains(&"split_kv_prep".to_string())
                && eight.contains(&"split_kv_merge_d64".to_string())
                && !eight.iter().any(|n| n.starts_with("prep_vt")),
            "{eight:?}"
        );
        assert_eq!(
            eight.len(),
            8,
            "stage, merge, varlen, the plan's three and split-KV's two: {eight:?}"
        );
        assert_eq!(names(Stage::S5, 64), ["stage5_d64"]);
    }
}
