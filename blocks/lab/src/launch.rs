// A kernel launch through cuLaunchKernelEx, optionally as a programmatic dependent launch (PDL).
use std::ffi::c_void;
use std::marker::PhantomData;

use anyhow::{Context, Result};
use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig};

/// A kernel's arguments by reference, in the order of its parameters, for [`launch_ex`]. Only plain values (device
/// addresses as `u64`, `#[repr(C)]` tables, integers): unlike cudarc's builder it tracks no `CudaSlice`'s events.
#[derive(Debug, Default)]
pub struct Args<'a> {
    ptrs: Vec<*mut c_void>,
    _borrows: PhantomData<&'a ()>,
}

impl<'a> Args<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    /// The next parameter's value, read at the launch.
    pub fn arg<T>(&mut self, x: &'a T) -> &mut Self {
        self.ptrs.push(x as *const T as *mut c_void);
        self
    }
}

/// How a launch is ordered after the work before it on its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// After the previous work has finished (an ordinary launch).
    Serial,
    /// Programmatic dependent launch: the kernel may start while the previous kernel runs, and must execute
    /// `griddepcontrol.wait` (which returns once that kernel has finished and its writes are visible) before it
    /// reads or writes anything that kernel may touch.
    Programmatic,
}

impl Order {
    /// [`Order::Programmatic`] where `on`, else [`Order::Serial`].
    pub fn programmatic_if(on: bool) -> Order {
        if on {
            Order::Programmatic
        } else {
            Order::Serial
        }
    }
}

/// Launches `func` with `args` on `st`.
///
/// # Safety
/// `args` match the kernel's parameters in number, order and layout, and the grid, block and shared memory are
/// those it was written for; with [`Order::Programmatic`], the kernel waits (`griddepcontrol.wait`) before any
/// access to global memory that the previous work in the stream may read or write.
pub unsafe fn launch_ex(
    func: &CudaFunction,
    cfg: LaunchConfig,
    st: &CudaStream,
    args: &mut Args<'_>,
    order: Order,
) -> Result<()> {
    st.context().bind_to_thread()?;
    // SAFETY: a zeroed attribute is a valid value of the plain-data union; its id and value are set below.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let programmatic = order == Order::Programmatic;
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: st.cu_stream(),
        attrs: if programmatic {
            &mut attr
        } else {
            std::ptr::null_mut()
        },
        numAttrs: u32::from(programmatic),
    };
    // SAFETY: the caller's contract above; `config`, `attr` and the argument pointers outlive the call.
    unsafe {
        sys::cuLaunchKernelEx(
            &config,
            func.cu_function(),
            args.ptrs.as_mut_ptr(),
            std::ptr::null_mut(),
        )
        .result()
    }
    .context("cuLaunchKernelEx")
}
