// Device quantization: real-valued Q, K, V to E4M3 on the GPU by a Scheme, bit for bit fixtures::prepare.
use anyhow::{Context, Result, ensure};
use fixtures::{OutDtype, Raw, Scheme};
use lab::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use lab::{Arch, Budget, Gpu, KernelSpec, Source};

use crate::OnDevice;
use crate::strides::FlatHeads;

/// K smoothing and its LSE correction (`cuda/prep.cu`); rotation and quantization are the blocks' own kernels.
pub const PREP: Source = Source {
    file: "prep.cu",
    code: include_str!("../cuda/prep.cu"),
    headers: &[],
};

const fn k(name: &'static str) -> KernelSpec {
    // Scalar loops with an f64 accumulator: 64 registers is ample, no shared memory.
    KernelSpec {
        block: "composed",
        name,
        source: &PREP,
        budget: Budget::new(64, 0),
        archs: &Arch::REQUIRED,
        sass: &[],
    }
}

pub const SMOOTH_K: KernelSpec = k("prep_smooth_k");
pub const LSE_SHIFT: KernelSpec = k("prep_lse_shift");
/// V transposed for the TMA stages (a block's [`vt_block_keys`] keys × D bytes, rows padded by a word: at most 1,024
/// keys of 16 bytes, 20,480 bytes of static shared memory, within the 64-register budget).
pub const TRANSPOSE_V: KernelSpec = KernelSpec {
    budget: Budget::new(64, 20480),
    ..k("prep_vt")
};
/// Vᵀ as stage 7's tile images at D = 128 (one tile of up to 224 keys × D ≤ 128 bytes, rows padded by a word:
/// 29,568 bytes of static shared memory).
pub const VT_TILES: KernelSpec = KernelSpec {
    budget: Budget::new(64, 29568),
    ..k("prep_vt_tiles")
};
pub const PREP_KERNELS: &[KernelSpec] = &[SMOOTH_K, LSE_SHIFT, TRANSPOSE_V, VT_TILES];

/// Vᵀ as tile images ([`VT_TILES`]) for key tiles of `bc` keys: tile t of K/V head h is the bc·D bytes at (h·⌈Sk /
/// bc⌉ + t)·bc·D, the shared-memory image of the tile (fp8-relayout's transposed tile: K-major, 32-byte swizzled
/// panels, keys in `KeyOrder::Local` order, zeros past Sk). The host model of `prep_vt_tiles`.
pub fn vt_tiles_model(v: &[u8], s: &fixtures::Shape, bc: usize) -> Vec<u8> {
    let (sk, d) = (s.sk, s.d);
    let tiles = sk.div_ceil(bc);
    let mut out = Vec::with_capacity(s.kv_heads() * tiles * bc * d);
    for h in 0..s.kv_heads() {
        for t in 0..tiles {
            let mut rows = vec![0u8; bc * d];
            for r in 0..bc.min(sk - t * bc) {
                let at = (h * sk + t * bc + r) * d;
                rows[r * d..(r + 1) * d].copy_from_slice(&v[at..at + d]);
            }
            out.extend(fp8_relayout::transposed_in(
                &rows,
                bc,
                d,
                frag_layout::Swizzle::B32,
                0,
                fp8_relayout::KeyOrder::Local,
            ));
        }
    }
    out
}

/// Bytes of [`vt_tiles_model`]'s layout for `s` and `bc`.
pub fn vt_tiles_bytes(s: &fixtures::Shape, bc: usize) -> usize {
    s.kv_heads() * s.sk.div_ceil(bc) * bc * s.d
}

/// Vᵀ's tile images on the device (`prep_vt_tiles` through `spec`) of the V at device address `v` (the problem's
/// B·Hkv heads of Sk rows of D E4M3, laid out as `rows` says), on stream `st`; fails by name where the device lacks
/// the memory.
pub fn vt_tiles_with(
    gpu: &Gpu,
    spec: &KernelSpec,
    st: &std::sync::Arc<lab::cudarc::driver::CudaStream>,
    (v, rows): (u64, FlatHeads),
    s: &fixtures::Shape,
    bc: usize,
) -> Result<CudaSlice<u8>> {
    let bytes = vt_tiles_bytes(s, bc);
    ensure_free(gpu, bytes, "stage 7 needs Vᵀ's tile images")?;
    let mut img = st.alloc_zeros::<u8>(bytes)?;
    launch_vt_tiles(gpu, spec, st, (v, rows), s, bc, &mut img)?;
    Ok(img)
}

/// `prep_vt_tiles` through `spec` into `img`, which [`vt_tiles_with`] sized for `s` and `bc`.
pub(crate) fn launch_vt_tiles(
    gpu: &Gpu,
    spec: &KernelSpec,
    st: &std::sync::Arc<lab::cudarc::driver::CudaStream>,
    v: (u64, FlatHeads),
    s: &fixtures::Shape,
    bc: usize,
    img: &mut CudaSlice<u8>,
) -> Result<()> {
    ensure!(
        img.len() == vt_tiles_bytes(s, bc),
        "Vᵀ's tile images hold {} bytes, and {} K/V heads of Sk = {}, D = {} in tiles of {bc} need {}",
        img.len(),
        s.kv_heads(),
        s.sk,
        s.d,
        vt_tiles_bytes(s, bc)
    );
    ensure!(
        bc.is_multiple_of(32) && bc <= 224 && s.d.is_multiple_of(16) && s.d <= 128,
        "prep_vt_tiles takes tiles of up to 224 keys (a multiple of 32) and D up to 128, not {bc} and {}",
        s.d
    );
    let tiles = s.sk.div_ceil(bc);
    ensure!(
        tiles <= 65535 && s.kv_heads() <= i32::MAX as usize,
        "Vᵀ's tile images of Sk = {} keys and {} heads do not fit one grid",
        s.sk,
        s.kv_heads()
    );
    // prep_vt_tiles(const u8* v, int sk, int d, int bc, u8* out[heads·tiles·bc·d], i64 rs, i64 hs): bc ≤ 224 and d
    // ≤ 128 (the smem tile) and out's length checked above.
    launch_v_kernel(gpu, spec, st, v, s, bc, tiles, img)
}

/// One of the V-transposing kernels, `f(const u8* v, int sk, int d, int x, u8* out, i64 rs, i64 hs)` (head h's key r
/// at v + h·hs + r·rs), on a grid of (K/V heads, `blocks`) × 256 threads; the caller has checked `out` and `x`
/// against its kernel's contract.
#[allow(clippy::too_many_arguments)]
fn launch_v_kernel(
    gpu: &Gpu,
    spec: &KernelSpec,
    st: &std::sync::Arc<lab::cudarc::driver::CudaStream>,
    (v, rows): (u64, FlatHeads),
    s: &fixtures::Shape,
    x: usize,
    blocks: usize,
    out: &mut CudaSlice<u8>,
) -> Result<()> {
    ensure!(
        rows.row.is_multiple_of(16) && rows.row >= s.d && rows.head.is_multiple_of(16),
        "V read at a row stride of {} and a head stride of {} bytes: the transpose reads whole rows of D = {} by \
         16-byte loads (strides multiples of 16, rows not overlapping)",
        rows.row,
        rows.head,
        s.d
    );
    let kern = gpu.load(spec)?;
    let (sk, d, xi) = (s.sk as i32, s.d as i32, x as i32);
    let (rs, hs) = (rows.row as i64, rows.head as i64);
    let cfg = LaunchConfig {
        grid_dim: (s.kv_heads() as u32, blocks as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the kernel's signature is the one above; v holds the view's heads·sk rows of d bytes (the problem's V
    // at `rows`), and the caller checked out's length and x for the grid it asks for.
    unsafe {
        st.launch_builder(&kern.func)
            .arg(&v)
            .arg(&sk)
            .arg(&d)
            .arg(&xi)
            .arg(out)
            .arg(&rs)
            .arg(&hs)
            .launch(cfg)
    }
    .with_context(|| format!("launching {}", spec.name))?;
    Ok(())
}

/// Keys a `prep_vt` block transposes at head dimension `d` (prep.cu's `vt_block_keys`): 16 KiB of V, at least 32
/// keys, a multiple of 32.
pub fn vt_block_keys(d: usize) -> usize {
    32 * (512 / d).max(1)
}

/// Keys of Vᵀ's rows: Sk rounded up to 32 (P's key order permutes inside groups of 32; rows of a multiple of 16
/// bytes are what a tensor map takes).
pub fn vt_keys(sk: usize) -> usize {
    sk.next_multiple_of(32)
}

/// Vᵀ of `v` ([B·H, Sk, D] E4M3) as the TMA stages load it: [B·H, D, vt_keys(Sk)], row c of head h holding key
/// `KeyOrder::Local.key(k)` at position k (zero past Sk). The host model of `prep_vt`.
pub fn transpose_v_model(v: &[u8], s: &fixtures::Shape) -> Vec<u8> {
    let (sk, d, kp) = (s.sk, s.d, vt_keys(s.sk));
    let mut out = vec![0u8; s.kv_heads() * d * kp];
    for h in 0..s.kv_heads() {
        for c in 0..d {
            for k in 0..kp {
                let key = fp8_relayout::KeyOrder::Local.key(k as u32) as usize;
                if key < sk {
                    out[(h * d + c) * kp + k] = v[(h * sk + key) * d + c];
                }
            }
        }
    }
    out
}

/// Fails, naming `what` and both sizes, unless the device has `bytes` free.
fn ensure_free(gpu: &Gpu, bytes: usize, what: &str) -> Result<()> {
    let (free, _) = gpu
        .ctx
        .mem_get_info()
        .context("asking the device for its free memory")?;
    ensure!(
        bytes <= free,
        "{what}, {:.2} GiB, and the device has {:.2} GiB free",
        bytes as f64 / f64::from(1u32 << 30),
        free as f64 / f64::from(1u32 << 30)
    );
    Ok(())
}

/// Vᵀ on the device (`prep_vt` through `spec`) of the V at device address `v` (B·Hkv heads of Sk rows of D E4M3,
/// laid out as its `FlatHeads` say), on stream `st`; fails by name where the device lacks the memory.
pub fn transpose_v_with(
    gpu: &Gpu,
    spec: &KernelSpec,
    st: &std::sync::Arc<lab::cudarc::driver::CudaStream>,
    v: (u64, FlatHeads),
    s: &fixtures::Shape,
) -> Result<CudaSlice<u8>> {
    let kp = vt_keys(s.sk);
    let bytes = s.kv_heads() * s.d * kp;
    ensure_free(gpu, bytes, "the TMA stages need Vᵀ")?;
    ensure!(
        kp.div_ceil(vt_block_keys(s.d)) <= 65535 && s.kv_heads() <= i32::MAX as usize,
        "Vᵀ of Sk = {} keys and {} heads does not fit one transpose grid",
        s.sk,
        s.kv_heads()
    );
    let mut vt = st.alloc_zeros::<u8>(bytes)?;
    launch_transpose_v(gpu, spec, st, v, s, &mut vt)?;
    Ok(vt)
}

/// `prep_vt` through `spec` into `vt`, which [`transpose_v_with`] sized and checked for `s`.
pub(crate) fn launch_transpose_v(
    gpu: &Gpu,
    spec: &KernelSpec,
    st: &std::sync::Arc<lab::cudarc::driver::CudaStream>,
    v: (u64, FlatHeads),
    s: &fixtures::Shape,
    vt: &mut CudaSlice<u8>,
) -> Result<()> {
    let kp = vt_keys(s.sk);
    ensure!(
        vt.len() == s.kv_heads() * s.d * kp,
        "Vᵀ holds {} bytes, and a shape of {} K/V heads, D = {}, Sk = {} needs {}",
        vt.len(),
        s.kv_heads(),
        s.d,
        s.sk,
        s.kv_heads() * s.d * kp
    );
    ensure!(
        (16..=256).contains(&s.d) && s.d.is_multiple_of(16),
        "prep_vt transposes rows of D = 16 to 256 bytes (a multiple of 16), not {}",
        s.d
    );
    // prep_vt(const u8* v, int sk, int d, int sk_pad, u8* vt[heads·d·sk_pad], i64 rs, i64 hs) on (heads,
    // ⌈sk_pad / vt_block_keys(d)⌉) blocks: d checked above (a block's keys fit its shared rows); vt's length too.
    launch_v_kernel(gpu, spec, st, v, s, kp, kp.div_ceil(vt_block_keys(s.d)), vt)
}

/// What the third tensor map of a TMA stage describes (`tma_maps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VMap {
    /// Vᵀ made beforehand, [B·Hkv, D, keys], at this address.
    Vt(u64),
    /// V as the caller has it, [B·Hkv, Sk, D], read in K's boxes and transposed in the kernel.
    V(u64),
    /// Nothing the kernel reads (Vᵀ comes as tile images).
    Unread,
}

/// The tensor maps of the TMA stages, for Q, K and Vᵀ at the given device addresses (Q and K read as their
/// `FlatHeads` say): each [B·H, rows, row bytes] as a 4-D map (row bytes, rows, B·H, 1) whose box is one canonical
/// wgmma tile, or one K panel of it: Q 64 rows and K `bc` keys of D bytes (64- or 128-byte swizzle); Vᵀ D rows of 128 keys (128-byte swizzle)
/// when `bc` is 128, else D rows of 64 keys (64-byte swizzle), `bc` / 64 boxes a tile (`TmaBlock::kSwVt`).
/// The third slot is `v`'s: Vᵀ's map, V's (stage 8, `Stage::transposes_v`: K's boxes over V [B·Hkv, Sk, D]), or,
/// for a stage that loads Vᵀ as tile images by bulk copy (`Stage::vt_image`), K's map, which that kernel does
/// not read. The fourth is O's for a TMA store (`Stage::tma_store`): `o`, a
/// 16-bit [B·H, Sq, D] tensor, in boxes of 64 rows × 64 columns (128 bytes, 128-byte swizzle); without `o` (f32
/// O, written directly) Q's map fills it.
pub(crate) fn tma_maps(
    s: &fixtures::Shape,
    bc: usize,
    [(q, qr), (k, kr)]: [(u64, FlatHeads); 2],
    v: VMap,
    o: Option<u64>,
    o_extra: usize,
) -> Result<[tma_ring::TensorMap; 4]> {
    use frag_layout::Swizzle;
    use tma_ring::{Elem, MapSpec};
    let sw = if s.d == 64 {
        Swizzle::B64
    } else {
        Swizzle::B128
    };
    let sw_vt = if bc.is_multiple_of(128) {
        Swizzle::B128
    } else if bc.is_multiple_of(64) {
        Swizzle::B64
    } else {
        Swizzle::B32
    };
    let (heads, kv_heads) = (s.heads() as u64, s.kv_heads() as u64);
    let (d, sq, sk) = (s.d as u64, s.sq as u64, s.sk as u64);
    // Q and K as (D, S, B·H, 1) over their flat heads' strides (the unit dimension's stride past the last head).
    let flat = |heads: u64, r: FlatHeads| [r.row as u64, r.head as u64, heads * r.head as u64];
    let km = MapSpec::strided(
        Elem::U8,
        [1, kv_heads, sk, d],
        flat(kv_heads, kr),
        bc as u32,
        sw,
    )
    .encode(k)
    .with_context(|| {
        format!(
            "k at row and head strides {} and {} elements",
            kr.row, kr.head
        )
    })?;
    let qm = MapSpec::strided(Elem::U8, [1, heads, sq, d], flat(heads, qr), 64, sw)
        .encode(q)
        .with_context(|| {
            format!(
                "q at row and head strides {} and {} elements",
                qr.row, qr.head
            )
        })?;
    Ok([
        qm,
        km,
        match v {
            VMap::Vt(vt) => MapSpec::heads(
                Elem::U8,
                [1, kv_heads, d, vt_keys(s.sk) as u64],
                false,
                s.d as u32,
                sw_vt,
            )
            .encode(vt)?,
            VMap::V(v) => {
                MapSpec::heads(Elem::U8, [1, kv_heads, sk, d], false, bc as u32, sw).encode(v)?
            }
            VMap::Unread => km,
        },
        match o {
            Some(o) => o_map(s, o, o_extra)?,
            None => qm,
        },
    ])
}

/// O's map for the TMA stores: a 16-bit [B·H + `o_extra`, Sq, D] tensor (O's heads and, past them, the virtual heads
/// a split tail's parts write: `SplitPlan`) in boxes of 64 rows × 64 columns (128 bytes, 128-byte swizzle).
fn o_map(s: &fixtures::Shape, o: u64, o_extra: usize) -> Result<tma_ring::TensorMap> {
    use frag_layout::Swizzle;
    use tma_ring::{Elem, MapSpec};
    let (heads, sq, d) = (s.heads() as u64, s.sq as u64, s.d as u64);
    MapSpec::heads(
        Elem::U16,
        [1, heads + o_extra as u64, sq, d],
        false,
        64,
        Swizzle::B128,
    )
    .encode(o)
}

/// Stage 8's tensor maps: Q, K and V of `s` at their `strides` (`Strides`), each (D, S, H, B) in boxes of one K
/// panel × 64 query rows or `bc` keys (V's as K's: stage 8 transposes its tiles in shared memory), and O's as
/// [`tma_maps`] makes it. A stride that is not a multiple of 16 bytes is refused by name, naming the tensor.
pub(crate) fn tma_maps_strided(
    s: &fixtures::Shape,
    bc: usize,
    [q, k, v]: [u64; 3],
    strides: crate::strides::Strides,
    o: Option<u64>,
    o_extra: usize,
) -> Result<[tma_ring::TensorMap; 4]> {
    use frag_layout::Swizzle;
    use tma_ring::{Elem, MapSpec};
    let sw = if s.d == 64 {
        Swizzle::B64
    } else {
        Swizzle::B128
    };
    let u = |x: [usize; 3]| x.map(|e| e as u64);
    let (b, h, hkv, d) = (s.b as u64, s.h as u64, s.hkv as u64, s.d as u64);
    let map = |name: &str, at: u64, heads: u64, rows: usize, st: [usize; 3], bx: usize| {
        MapSpec::strided(Elem::U8, [b, heads, rows as u64, d], u(st), bx as u32, sw)
            .encode(at)
            .with_context(|| format!("{name} at strides (S, H, B) = {st:?} elements"))
    };
    let qm = map("q", q, h, s.sq, strides.q, 64)?;
    let km = map("k", k, hkv, s.sk, strides.k, bc)?;
    let vm = map("v", v, hkv, s.sk, strides.v, bc)?;
    // Without O's map (f32 O, written directly) Q's fills its slot, as in tma_maps.
    let om = match o {
        Some(o) => o_map(s, o, o_extra)?,
        None => qm,
    };
    Ok([qm, km, vm, om])
}

/// The kernels of the device pipeline; a mutation test replaces one.
#[derive(Debug, Clone, Copy)]
pub struct Prep {
    pub smooth_k: KernelSpec,
    pub lse_shift: KernelSpec,
    pub quantizer: fp8_codec::TensorQuantizer,
}

impl Default for Prep {
    fn default() -> Self {
        Prep {
            smooth_k: SMOOTH_K,
            lse_shift: LSE_SHIFT,
            quantizer: fp8_codec::TensorQuantizer::default(),
        }
    }
}

impl OnDevice {
    /// Uploads real-valued inputs and quantizes them on the device by `scheme`: smoothing K, rotating Q and K,
    /// quantizing Q, K, V; one f32 tensor on the device at a time. Fails before any allocation if the device
    /// lacks the memory, naming the parts.
    pub fn prepare(gpu: &Gpu, raw: &Raw, scheme: Scheme, out: OutDtype) -> Result<Self> {
        Self::prepare_with(gpu, &Prep::default(), raw, scheme, out)
    }

    /// As [`OnDevice::prepare`] through `prep`'s kernels.
    pub fn prepare_with(
        gpu: &Gpu,
        prep: &Prep,
        raw: &Raw,
        scheme: Scheme,
        out: OutDtype,
    ) -> Result<Self> {
        let s = raw.shape;
        let rotation = scheme.rotate.rotation(s.d)?;
        crate::validate_shape(&s)?;
        let (nq, nk) = (s.heads() * s.sq * s.d, s.kv_heads() * s.sk * s.d);
        for (name, t, n) in [("q", &raw.q, nq), ("k", &raw.k, nk), ("v", &raw.v, nk)] {
            ensure!(
                t.len() == n,
                "tensor `{name}` has {} elements, [B, H, Sq, Sk, D] = [{}, {}, {}, {}, {}] needs {n}",
                t.len(),
                s.b,
                s.h,
                s.sq,
                s.sk,
                s.d
            );
        }
        let mut extra = vec![("f32 staging", 4 * nq.max(nk))];
        if scheme.smooth_k {
            extra.push(("LSE shift", 4 * s.heads() * s.sq));
        }
        Self::check_fits_with(gpu, &s, out, &extra)?;
        let st = &gpu.stream;
        let softmax_scale = 1.0 / (s.d as f32).sqrt();
        let quantize = |x: &CudaSlice<f32>, heads: usize, rows: usize| {
            prep.quantizer
                .run(gpu, x, heads, rows * s.d, scheme.per)
                .with_context(|| format!("quantizing on the device ({})", scheme.name()))
        };
        // K first: smoothing it gives the means that Q's LSE shift needs.
        let mut kf = st.clone_htod(&raw.k)?;
        let mu = if scheme.smooth_k {
            let mut mu = st.alloc_zeros::<f32>(s.kv_heads() * s.d)?;
            let kern = gpu.load(&prep.smooth_k)?;
            let (sk, d) = (s.sk as i32, s.d as i32);
            let cfg = LaunchConfig {
                grid_dim: (s.kv_heads() as u32, 1, 1),
                block_dim: (s.d as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: prep_smooth_k(float* k[heads·sk·d], int sk, int d, float* mu[heads·d]); a block of D
            // threads a head (heads ≤ 2^31 − 1, checked by validate_shape's grid limits in the launch path).
            unsafe {
                st.launch_builder(&kern.func)
                    .arg(&mut kf)
                    .arg(&sk)
                    .arg(&d)
                    .arg(&mut mu)
                    .launch(cfg)
            }
            .context("launching prep_smooth_k")?;
            Some(mu)
        } else {
            None
        };
        if let Some(r) = &rotation {
            r.apply(gpu, &mut kf, false)?;
        }
        let (kc, ks) = quantize(&kf, s.kv_heads(), s.sk)?;
        drop(kf);
        let mut qf = st.clone_htod(&raw.q)?;
        let shift = match &mu {
            Some(mu) => {
                let rows = (s.heads() * s.sq) as i64;
                let mut shift = st.alloc_zeros::<f32>(rows as usize)?;
                let kern = gpu.load(&prep.lse_shift)?;
                let (sq, d, group) = (s.sq as i32, s.d as i32, s.group() as i32);
                let cfg = LaunchConfig {
                    grid_dim: ((rows as u64).div_ceil(256).min(1 << 20) as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: prep_lse_shift(const float* q[rows·d], long long rows, int sq, int d, int group,
                // const float* mu[kv_heads·d], float softmax_scale, float* shift[rows]), grid-stride.
                unsafe {
                    st.launch_builder(&kern.func)
                        .arg(&qf)
                        .arg(&rows)
                        .arg(&sq)
                        .arg(&d)
                        .arg(&group)
                        .arg(mu)
                        .arg(&softmax_scale)
                        .arg(&mut shift)
                        .launch(cfg)
                }
                .context("launching prep_lse_shift")?;
                Some(shift)
            }
            None => None,
        };
        if let Some(r) = &rotation {
            r.apply(gpu, &mut qf, false)?;
        }
        let (qc, qs) = quantize(&qf, s.heads(), s.sq)?;
        drop(qf);
        let vf = st.clone_htod(&raw.v)?;
        let (vc, vs) = quantize(&vf, s.kv_heads(), s.sk)?;
        drop(vf);
        Self::assemble(
            gpu,
            s,
            softmax_scale,
            [qc, kc, vc],
            [qs, ks, vs],
            out,
            shift,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transpose_blocks_keys_fit_its_shared_rows_in_groups_of_32() {
        for d in (16..=256).step_by(16) {
            let n = vt_block_keys(d);
            assert!(n.is_multiple_of(32) && n * d <= 16384, "D = {d}: {n} keys");
            let bytes = n * (d / 4 + 1) * 4;
            assert!(
                bytes <= TRANSPOSE_V.budget.max_smem_bytes as usize,
                "D = {d}: {n} keys need {bytes} bytes of shared rows"
            );
        }
        assert_eq!(
            [64, 128, 256].map(vt_block_keys),
            [256, 128, 64],
            "16 KiB a block at the stages' head dimensions"
        );
    }
}
