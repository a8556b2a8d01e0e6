// The library's errors: every bad input named before any launch, and what the device said when a launch failed.
use thiserror::Error;

/// What went wrong, with what was asked and what was wrong with it.
#[derive(Debug, Error)]
pub enum Error {
    /// A head dimension the kernels are not built for.
    #[error(
        "head dimension D = {0} is not supported: the kernels are built for D = 64, 128 and 256 (256 on sm_90)"
    )]
    HeadDim(usize),
    /// A zero batch, head count or sequence length.
    #[error("{what} = {got}: it must be at least 1")]
    Empty {
        /// The size's name.
        what: &'static str,
        /// Its value.
        got: usize,
    },
    /// Query heads that are not a multiple of the key/value heads.
    #[error(
        "H = {h} query heads is not a multiple of Hkv = {hkv} key/value heads (grouped-query attention)"
    )]
    HeadRatio {
        /// Query heads.
        h: usize,
        /// Key/value heads.
        hkv: usize,
    },
    /// A tensor whose element count does not match its [B, heads, S, D].
    #[error("`{tensor}` holds {got} elements, and [B, heads, S, D] = {dims:?} needs {want}")]
    Length {
        /// The tensor's name.
        tensor: &'static str,
        /// Elements it holds.
        got: usize,
        /// Elements its dims need.
        want: usize,
        /// [B, heads, S, D].
        dims: [usize; 4],
    },
    /// A scale tensor without one scale per (batch, head).
    #[error("`{tensor}` holds {got} scales, and one per (batch, head) needs {want}")]
    Scales {
        /// The scale tensor's name.
        tensor: &'static str,
        /// Scales it holds.
        got: usize,
        /// Scales it needs.
        want: usize,
    },
    /// An input the kernels cannot read as laid out: a real-valued view (strides, alignment, past its buffer), E4M3
    /// strides TMA refuses, or a packed batch's boundaries.
    #[error("`{tensor}`: {why}")]
    Layout {
        /// The tensor's name.
        tensor: &'static str,
        /// What is wrong with its view.
        why: String,
    },
    /// Ring attention across ranks: a rank's inputs refused (this rank's or a peer's, named), or the ring stalled.
    #[error("ring: {0}")]
    Ring(String),
    /// Caller-provided outputs of the wrong dtype or too small.
    #[error("outputs: {0}")]
    Output(String),
    /// A softmax scale that is zero, negative, infinite or NaN.
    #[error("softmax scale {0} is not positive and finite")]
    SoftmaxScale(f32),
    /// What this device's kernels cannot do (causal masking or grouped-query heads before sm_90).
    #[error("{0}")]
    Unsupported(String),
    /// The driver, NVRTC or the launch failed: the chain of causes, outermost first.
    #[error(transparent)]
    Device(#[from] anyhow::Error),
}

/// The library's result.
pub type Result<T> = std::result::Result<T, Error>;
