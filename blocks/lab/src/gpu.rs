// Decides once whether a CUDA device is usable, gates GPU tests on it, and loads compiled kernels.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{Context, Result, anyhow, bail, ensure};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

use crate::compile::{Arch, KernelSpec};
use crate::resources::Resources;

/// What the machine offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuStatus {
    Present {
        name: String,
        major: i32,
        minor: i32,
    },
    Absent(String),
}

/// What a GPU test does here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    Run,
    /// Listed as skipped, with the reason shown.
    Skip(String),
    /// A GPU is required (`LAB_REQUIRE_GPU=1`) but none is usable: the test fails with this message.
    Fail(String),
}

/// The policy, kept pure so it can be tested on any machine.
pub fn gate(status: &GpuStatus, require_gpu: bool) -> Gate {
    match (status, require_gpu) {
        (GpuStatus::Present { .. }, _) => Gate::Run,
        (GpuStatus::Absent(why), false) => Gate::Skip(format!("no usable GPU: {why}")),
        (GpuStatus::Absent(why), true) => Gate::Fail(format!(
            "LAB_REQUIRE_GPU=1 but no usable GPU: {why}. Run this on the GPU machine, or unset LAB_REQUIRE_GPU \
             to list GPU tests as skipped."
        )),
    }
}

pub fn require_gpu_from_env() -> bool {
    std::env::var("LAB_REQUIRE_GPU").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

fn probe_status() -> GpuStatus {
    // SAFETY: only checks whether libcuda can be opened; cudarc would panic on first use otherwise.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return GpuStatus::Absent("the NVIDIA driver library libcuda.so.1 is not installed".into());
    }
    if let Err(e) = cudarc::driver::result::init() {
        return GpuStatus::Absent(format!("cuInit failed: {e}"));
    }
    match cudarc::driver::result::device::get_count() {
        Ok(0) => return GpuStatus::Absent("the driver sees no CUDA device".into()),
        Err(e) => return GpuStatus::Absent(format!("cuDeviceGetCount failed: {e}")),
        Ok(_) => {}
    }
    match CudaContext::new(0).and_then(|c| Ok((c.name()?, c.compute_capability()?))) {
        Ok((name, (major, minor))) => GpuStatus::Present { name, major, minor },
        Err(e) => GpuStatus::Absent(format!("creating a context on device 0 failed: {e}")),
    }
}

/// Decided once per process.
pub fn status() -> &'static GpuStatus {
    static S: OnceLock<GpuStatus> = OnceLock::new();
    S.get_or_init(probe_status)
}

/// A loaded kernel's key: its `'static` source's address, its name, its extra options.
type LoadKey = (usize, &'static str, Vec<String>);

/// The address of the cached cubin a module was loaded from.
type ModuleKey = usize;

/// A usable device: context, stream, and the architecture kernels are compiled for.
#[derive(Debug)]
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub arch: Arch,
    pub name: String,
    /// Streaming multiprocessors: what a grid must cover to use the whole device.
    pub sms: usize,
    modules: Mutex<HashMap<ModuleKey, Arc<CudaModule>>>,
    /// Kernels loaded before, by the address of their `Source` (a `'static` value: a const's, or a leaked mutant's),
    /// kernel name and extra options: a call that launches the same kernel again skips hashing its source.
    loaded: Mutex<HashMap<LoadKey, Kernel>>,
}

/// A loaded kernel with the resources ptxas reported for it on this device's architecture.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub func: CudaFunction,
    pub resources: Resources,
    pub module: Arc<CudaModule>,
}

/// CUDA devices the driver sees (0 where there is no usable GPU).
pub fn device_count() -> usize {
    match status() {
        GpuStatus::Present { .. } => {
            cudarc::driver::result::device::get_count().map_or(0, |n| n as usize)
        }
        GpuStatus::Absent(_) => 0,
    }
}

/// Devices a process opens at most ([`Gpu::device`]).
pub const MAX_DEVICES: usize = 8;

impl Gpu {
    /// The process's device (ordinal 0), or why there is none.
    pub fn get() -> Result<&'static Gpu> {
        Gpu::device(0)
    }

    /// Device `ordinal` of this process (each opened once, with its own context, stream and kernel caches), or why
    /// it cannot be used: several GPUs of one host, one a rank.
    pub fn device(ordinal: usize) -> Result<&'static Gpu> {
        static G: [OnceLock<std::result::Result<Gpu, String>>; MAX_DEVICES] =
            [const { OnceLock::new() }; MAX_DEVICES];
        let slot = G.get(ordinal).ok_or_else(|| {
            anyhow!("device {ordinal}: this process opens at most {MAX_DEVICES} devices")
        })?;
        slot.get_or_init(|| Gpu::open(ordinal).map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| anyhow!("{e}"))
    }

    fn open(ordinal: usize) -> Result<Gpu> {
        if let GpuStatus::Absent(why) = status() {
            bail!("no usable GPU: {why}");
        }
        let count = device_count();
        ensure!(
            ordinal < count,
            "device {ordinal} does not exist: the driver sees {count} device(s)"
        );
        let ctx = CudaContext::new(ordinal)
            .with_context(|| format!("creating the CUDA context on device {ordinal}"))?;
        let name = ctx.name().context("reading the device's name")?;
        let (major, minor) = ctx
            .compute_capability()
            .context("reading the compute capability")?;
        let stream = ctx.default_stream();
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .context("reading the SM count")? as usize;
        Ok(Gpu {
            ctx,
            stream,
            arch: Arch::for_device(major, minor)?,
            name,
            sms,
            modules: Mutex::new(HashMap::new()),
            loaded: Mutex::new(HashMap::new()),
        })
    }

    /// The device's PCI bus id (`0000:19:00.0`), by which NVML finds the same device ([`crate::telemetry`]).
    pub fn pci_bus_id(&self) -> Result<String> {
        let mut buf = [0 as std::ffi::c_char; 32];
        // SAFETY: the buffer is writable for its stated length, and the driver writes a NUL-terminated string.
        unsafe {
            cudarc::driver::sys::cuDeviceGetPCIBusId(
                buf.as_mut_ptr(),
                buf.len() as i32,
                self.ctx.cu_device(),
            )
        }
        .result()
        .context("reading the device's PCI bus id")?;
        // SAFETY: NUL-terminated within the buffer (above).
        let id = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        Ok(id.to_string_lossy().into_owned())
    }

    /// Compiles (once per source and options) and loads `spec` for this device.
    pub fn load(&self, spec: &KernelSpec) -> Result<Kernel> {
        self.load_with(spec, &[])
    }

    /// As [`Gpu::load`], with extra NVRTC options such as `-DSTAGES=3`. A kernel that needs sm_90a is built for
    /// sm_90a on an sm_90 device; one this device cannot run is refused by name, before any launch.
    pub fn load_with(&self, spec: &KernelSpec, extra: &[&str]) -> Result<Kernel> {
        let memo = (
            std::ptr::from_ref(spec.source) as usize,
            spec.name,
            extra.iter().map(|x| x.to_string()).collect::<Vec<_>>(),
        );
        if let Some(k) = self
            .loaded
            .lock()
            .map_err(|_| anyhow!("kernel cache poisoned"))?
            .get(&memo)
        {
            return Ok(k.clone());
        }
        let k = self.load_uncached(spec, extra)?;
        self.loaded
            .lock()
            .map_err(|_| anyhow!("kernel cache poisoned"))?
            .insert(memo, k.clone());
        Ok(k)
    }

    fn load_uncached(&self, spec: &KernelSpec, extra: &[&str]) -> Result<Kernel> {
        let target = spec.target_for(self.arch)?;
        let cubin = crate::compile::compile(spec.source, target, extra)?;
        let resources = cubin.kernel(spec.name)?.clone();
        // By the cubin (one per source content, arch and options): a mutated header under the same file name
        // must get its own module.
        let key = Arc::as_ptr(&cubin) as usize;
        let module = {
            let mut m = self
                .modules
                .lock()
                .map_err(|_| anyhow!("module cache poisoned"))?;
            match m.get(&key) {
                Some(module) => module.clone(),
                None => {
                    let module = self
                        .ctx
                        .load_module(Ptx::from_binary(cubin.image.clone()))
                        .with_context(|| {
                            format!("loading the cubin of `{}` ({target})", spec.source.file)
                        })?;
                    m.insert(key, module.clone());
                    module
                }
            }
        };
        let func = module.load_function(spec.name).with_context(|| {
            format!("loading kernel `{}` from `{}`", spec.name, spec.source.file)
        })?;
        Ok(Kernel {
            func,
            resources,
            module,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_gpu_skips_with_reason_or_fails_when_required() {
        let absent =
            GpuStatus::Absent("the NVIDIA driver library libcuda.so.1 is not installed".into());
        match gate(&absent, false) {
            Gate::Skip(r) => assert!(r.contains("libcuda.so.1"), "{r}"),
            g => panic!("expected skip, got {g:?}"),
        }
        match gate(&absent, true) {
            Gate::Fail(r) => {
                assert!(r.contains("LAB_REQUIRE_GPU=1"), "{r}");
                assert!(r.contains("libcuda.so.1"), "{r}");
            }
            g => panic!("expected failure, got {g:?}"),
        }
        let present = GpuStatus::Present {
            name: "H100".into(),
            major: 9,
            minor: 0,
        };
        assert_eq!(gate(&present, true), Gate::Run);
        assert_eq!(gate(&present, false), Gate::Run);
    }
}
