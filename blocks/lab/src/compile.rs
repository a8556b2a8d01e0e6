// NVRTC straight to cubin for an explicit architecture, with embedded block headers and the ptxas report.
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{Context, Result, anyhow};
use cudarc::nvrtc::sys;

use crate::resources::{Budget, Resources, parse_ptxas_log};

/// A target architecture. Kernels are always compiled to SASS for one of these, never to PTX for the JIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arch {
    Sm80,
    Sm89,
    Sm90,
    /// Hopper with the architecture-specific features (wgmma, setmaxnreg); only where a kernel asks for it.
    Sm90a,
}

impl Arch {
    /// The architectures every kernel must compile for: the A100 generation, the L4 the earlier attempt ran on,
    /// and the H100 the device tests run on.
    pub const REQUIRED: [Arch; 3] = [Arch::Sm80, Arch::Sm89, Arch::Sm90];

    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm80 => "sm_80",
            Arch::Sm89 => "sm_89",
            Arch::Sm90 => "sm_90",
            Arch::Sm90a => "sm_90a",
        }
    }

    pub fn parse(s: &str) -> Result<Arch> {
        match s.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "sm_80" | "80" => Ok(Arch::Sm80),
            "sm_89" | "89" => Ok(Arch::Sm89),
            "sm_90" | "90" => Ok(Arch::Sm90),
            "sm_90a" | "90a" => Ok(Arch::Sm90a),
            other => Err(anyhow!(
                "unknown architecture `{other}`: expected sm_80, sm_89, sm_90 or sm_90a"
            )),
        }
    }

    /// The architecture to compile for on a device of compute capability `major.minor`.
    pub fn for_device(major: i32, minor: i32) -> Result<Arch> {
        match (major, minor) {
            (8, 0) => Ok(Arch::Sm80),
            (8, 9) => Ok(Arch::Sm89),
            (9, 0) => Ok(Arch::Sm90),
            _ => Err(anyhow!(
                "compute capability {major}.{minor} is not one the lab targets (8.0, 8.9, 9.0)"
            )),
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A header embedded in the binary, found by `#include "name"` through NVRTC's header list.
#[derive(Debug, Clone, Copy)]
pub struct Header {
    pub name: &'static str,
    pub code: &'static str,
}

/// One `.cu` translation unit with the headers it may include.
#[derive(Debug, Clone, Copy)]
pub struct Source {
    pub file: &'static str,
    pub code: &'static str,
    pub headers: &'static [&'static [Header]],
}

/// One `extern "C"` kernel of a source, with the resource budget its block commits to.
#[derive(Debug, Clone, Copy)]
pub struct KernelSpec {
    pub block: &'static str,
    pub name: &'static str,
    pub source: &'static Source,
    pub budget: Budget,
    /// The architectures it must compile for: `Arch::REQUIRED` unless the hardware lacks the instructions
    /// (fp8 `mma.sync` needs sm_89; wgmma and setmaxnreg need sm_90a, and such kernels list sm_90a alone).
    pub archs: &'static [Arch],
    /// SASS opcodes the kernel exists to use (`QGMMA` for an FP8 wgmma kernel, `UTMALDG` for TMA loads): the
    /// compile test fails when one is absent, since the compiler may silently take a slower path.
    pub sass: &'static [&'static str],
}

/// A compiled translation unit: cubin bytes, and each entry's resources.
#[derive(Debug, Clone)]
pub struct Cubin {
    pub file: String,
    pub arch: Arch,
    pub image: Vec<u8>,
    pub resources: Vec<Resources>,
    pub log: String,
    pub options: Vec<String>,
}

impl Cubin {
    /// ptxas's and NVRTC's warnings and performance-loss notes that concern `kernel`, one line each: lines
    /// naming another function are left out, lines naming none count for every kernel of the source. C7512 /
    /// C7515 (wgmma serialised) and C7508 (setmaxnreg ignored) are silent slowdowns that ptxas prints as
    /// `info`. C7519 (a warpgroup.arrive injected before a wgmma) is not counted: FlashAttention-3's own
    /// builds print it.
    pub fn warnings(&self, kernel: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .log
            .lines()
            .filter(|l| {
                l.to_ascii_lowercase().contains("warning")
                    || l.contains("Performance Loss")
                    || ["C7508", "C7512", "C7515"].iter().any(|c| l.contains(c))
            })
            .filter(|l| match l.split("function '").nth(1) {
                Some(rest) => rest.split('\'').next() == Some(kernel),
                None => true,
            })
            .map(|l| l.trim().to_string())
            .collect();
        v.dedup();
        v
    }

    /// The report of one kernel, or an error naming the kernels the source does define.
    pub fn kernel(&self, name: &str) -> Result<&Resources> {
        self.resources.iter().find(|r| r.kernel == name).ok_or_else(|| {
            let have: Vec<&str> = self.resources.iter().map(|r| r.kernel.as_str()).collect();
            anyhow!(
                "kernel `{name}` not found in `{}` ({}): it defines [{}]. Kernels must be `extern \"C\" __global__`.",
                self.file,
                self.arch,
                have.join(", ")
            )
        })
    }
}

/// A compile that failed, with NVRTC's whole log, one line at a time.
#[derive(Debug)]
pub struct CompileError {
    pub file: String,
    pub kernel: Option<String>,
    pub arch: Arch,
    pub options: Vec<String>,
    pub log: String,
    pub status: String,
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match &self.kernel {
            Some(k) => format!("kernel `{k}` in `{}`", self.file),
            None => format!("`{}`", self.file),
        };
        writeln!(
            f,
            "NVRTC failed to compile {what} for {} ({})",
            self.arch, self.status
        )?;
        writeln!(f, "  options: {}", self.options.join(" "))?;
        writeln!(f, "  log:")?;
        for line in self.log.lines() {
            writeln!(f, "    | {line}")?;
        }
        Ok(())
    }
}

impl std::error::Error for CompileError {}

fn check(status: sys::nvrtcResult, what: &str) -> Result<()> {
    if status == sys::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: nvrtcGetErrorString returns a static string for every status.
    let msg = unsafe { CStr::from_ptr(sys::nvrtcGetErrorString(status)) };
    Err(anyhow!("{what}: {}", msg.to_string_lossy()))
}

/// Owns an NVRTC program, destroying it on every exit path.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the handle came from nvrtcCreateProgram and is destroyed once.
        unsafe {
            sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

/// The options every lab kernel is compiled with.
pub fn options(arch: Arch, include: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={}", arch.name()),
        "--std=c++17".to_string(),
        format!("--include-path={}", include.display()),
        "--ptxas-options=-v".to_string(),
        // NVRTC >= 12.9 caches compiles (with the driver's cache); a cache hit skips ptxas and returns no
        // `-v` report. Seen on the H100 machine, 2026-11-21: every second compile of a source had none.
        "--no-cache".to_string(),
        "-lineinfo".to_string(),
    ];
    o.extend(extra.iter().map(|s| s.to_string()));
    o
}

/// (file, hash of the code and every header, arch, options): by content, since the same `include_str!` text
/// may sit at several addresses in an optimised binary.
type CacheKey = (&'static str, u64, Arch, Vec<String>);

fn content_hash(src: &Source) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    src.code.hash(&mut h);
    for hs in src.headers {
        for hd in *hs {
            (hd.name, hd.code).hash(&mut h);
        }
    }
    h.finish()
}

static DISK_CACHE: OnceLock<PathBuf> = OnceLock::new();

/// Keeps compiled cubins (and their ptxas logs) in `dir` across processes, keyed by the source with its
/// headers, the architecture, the options and the toolchain: what a command-line tool wants, where NVRTC takes
/// seconds a stage. Test binaries do not call it, so that every test run compiles what it checks.
pub fn cache_cubins_in(dir: PathBuf) {
    let _ = DISK_CACHE.set(dir);
}

/// The cache file stem of one compile: two differently seeded 64-bit hashes of everything that shapes it.
fn disk_key(src: &Source, arch: Arch, opts: &[String], toolchain: &str) -> String {
    use std::hash::{Hash, Hasher};
    let one = |seed: u64| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (
            seed,
            src.file,
            content_hash(src),
            arch.name(),
            opts,
            toolchain,
        )
            .hash(&mut h);
        h.finish()
    };
    format!("{}-{arch}-{:016x}{:016x}", src.file, one(1), one(2))
}

/// Compiles `src` to a cubin for `arch`. `extra` adds options, e.g. `-DTILE=64`.
///
/// Compiles are cached per (source, arch, options), so a test binary compiles each source once, and
/// serialised so that the cache is filled once; and on disk when [`cache_cubins_in`] was called.
pub fn compile(src: &Source, arch: Arch, extra: &[&str]) -> Result<Arc<Cubin>> {
    static CACHE: OnceLock<Mutex<HashMap<CacheKey, Arc<Cubin>>>> = OnceLock::new();
    let tc = crate::toolchain::toolchain()?;
    let opts = options(arch, &tc.include, extra);
    let key = (src.file, content_hash(src), arch, opts.clone());
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| anyhow!("NVRTC cache poisoned"))?;
    if let Some(c) = cache.get(&key) {
        return Ok(c.clone());
    }
    let disk = DISK_CACHE.get().map(|dir| {
        let tc_words = format!("{:?} {:?} {}", tc.include, tc.nvrtc, tc.origin);
        dir.join(disk_key(src, arch, &opts, &tc_words))
    });
    if let Some(cubin) = disk
        .as_deref()
        .and_then(|stem| load_disk(stem, src, arch, &opts))
    {
        let cubin = Arc::new(cubin);
        cache.insert(key, cubin.clone());
        return Ok(cubin);
    }
    let cubin = compile_with(src, arch, &opts).map_err(|e| match e.downcast::<CompileError>() {
        Ok(ce) => anyhow::Error::new(ce),
        Err(other) => other.context(format!("compiling `{}` for {arch}", src.file)),
    })?;
    if let Some(stem) = &disk {
        // Best effort: a cache that cannot be written only costs the next run its compile.
        let _ = store_disk(stem, &cubin);
    }
    let cubin = Arc::new(cubin);
    cache.insert(key, cubin.clone());
    Ok(cubin)
}

/// `stem` + `.ext`. Not `Path::with_extension`: a stem such as `stage5.cu-sm_90a-<hash>` has a dot in the
/// source's file name, and replacing "the extension" there would drop the arch and the hash, so that every
/// version of a source shared one entry (a stale kernel after an edit, a mutant running as the original).
fn disk_file(stem: &Path, ext: &str) -> PathBuf {
    let mut s = stem.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    PathBuf::from(s)
}

/// A cached compile, if both its files are there.
fn load_disk(stem: &Path, src: &Source, arch: Arch, opts: &[String]) -> Option<Cubin> {
    let image = std::fs::read(disk_file(stem, "cubin")).ok()?;
    let log = std::fs::read_to_string(disk_file(stem, "log")).ok()?;
    Some(Cubin {
        file: src.file.into(),
        arch,
        image,
        resources: parse_ptxas_log(&log),
        log,
        options: opts.to_vec(),
    })
}

/// Writes the cubin, then its log: an entry whose log is missing (a write cut short) is never read.
fn store_disk(stem: &Path, c: &Cubin) -> std::io::Result<()> {
    std::fs::create_dir_all(stem.parent().unwrap_or(stem))?;
    std::fs::write(disk_file(stem, "cubin"), &c.image)?;
    std::fs::write(disk_file(stem, "log"), &c.log)
}

fn compile_with(src: &Source, arch: Arch, opts: &[String]) -> Result<Cubin> {
    let code = CString::new(src.code).context("source holds a NUL byte")?;
    let file = CString::new(src.file).context("file name holds a NUL byte")?;
    let headers: Vec<&Header> = src.headers.iter().flat_map(|hs| hs.iter()).collect();
    let h_code: Vec<CString> = headers
        .iter()
        .map(|h| CString::new(h.code))
        .collect::<Result<_, _>>()?;
    let h_name: Vec<CString> = headers
        .iter()
        .map(|h| CString::new(h.name))
        .collect::<Result<_, _>>()?;
    let h_code_p: Vec<*const c_char> = h_code.iter().map(|c| c.as_ptr()).collect();
    let h_name_p: Vec<*const c_char> = h_name.iter().map(|c| c.as_ptr()).collect();
    let c_opts: Vec<CString> = opts
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<Result<_, _>>()?;
    let c_opts_p: Vec<*const c_char> = c_opts.iter().map(|c| c.as_ptr()).collect();

    let mut raw = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call and the arrays have the lengths passed.
    check(
        unsafe {
            sys::nvrtcCreateProgram(
                &mut raw,
                code.as_ptr(),
                file.as_ptr(),
                headers.len() as i32,
                h_code_p.as_ptr(),
                h_name_p.as_ptr(),
            )
        },
        "nvrtcCreateProgram",
    )?;
    let prog = Program(raw);
    // SAFETY: the program is live, the options array outlives the call.
    let status =
        unsafe { sys::nvrtcCompileProgram(prog.0, c_opts_p.len() as i32, c_opts_p.as_ptr()) };
    let log = program_log(&prog)?;
    if status != sys::nvrtcResult::NVRTC_SUCCESS {
        // SAFETY: static string.
        let s = unsafe { CStr::from_ptr(sys::nvrtcGetErrorString(status)) }
            .to_string_lossy()
            .into_owned();
        return Err(anyhow::Error::new(CompileError {
            file: src.file.into(),
            kernel: None,
            arch,
            options: opts.to_vec(),
            log,
            status: s,
        }));
    }
    let mut size = 0usize;
    // SAFETY: the program compiled; size is written once.
    check(
        unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) },
        "nvrtcGetCUBINSize",
    )?;
    let mut image = vec![0u8; size];
    // SAFETY: the buffer holds exactly the size NVRTC reported.
    check(
        unsafe { sys::nvrtcGetCUBIN(prog.0, image.as_mut_ptr() as *mut c_char) },
        "nvrtcGetCUBIN",
    )?;
    if image.is_empty() {
        return Err(anyhow!(
            "NVRTC produced no cubin for `{}` ({arch}): was a virtual architecture given?",
            src.file
        ));
    }
    let resources = parse_ptxas_log(&log);
    if resources.is_empty() && src.code.contains("__global__") {
        return Err(anyhow!(
            "NVRTC compiled `{}` for {arch} but returned no ptxas report (options: {}); log:\n{log}",
            src.file,
            opts.join(" ")
        ));
    }
    Ok(Cubin {
        file: src.file.into(),
        arch,
        image,
        resources,
        log,
        options: opts.to_vec(),
    })
}

fn program_log(prog: &Program) -> Result<String> {
    let mut size = 0usize;
    // SAFETY: the program is live.
    check(
        unsafe { sys::nvrtcGetProgramLogSize(prog.0, &mut size) },
        "nvrtcGetProgramLogSize",
    )?;
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: the buffer holds the size NVRTC reported.
    check(
        unsafe { sys::nvrtcGetProgramLog(prog.0, buf.as_mut_ptr() as *mut c_char) },
        "nvrtcGetProgramLog",
    )?;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

impl KernelSpec {
    /// The kernel called `name` among `specs`: test kernels instantiated per shape are looked up by the
    /// shape's name. Panics with the list when absent, since that is a bug in the block's own tables.
    pub fn find(specs: &[KernelSpec], name: &str) -> KernelSpec {
        *specs.iter().find(|k| k.name == name).unwrap_or_else(|| {
            panic!(
                "no kernel `{name}` among [{}]",
                specs.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
            )
        })
    }

    /// The architecture to build this kernel for on a device of architecture `device`: the device's own, or
    /// sm_90a on an sm_90 device for kernels that need Hopper's architecture-specific instructions.
    pub fn target_for(&self, device: Arch) -> Result<Arch> {
        if self.archs.contains(&device) {
            Ok(device)
        } else if device == Arch::Sm90 && self.archs.contains(&Arch::Sm90a) {
            Ok(Arch::Sm90a)
        } else {
            Err(self.refusal(device))
        }
    }

    /// Why this kernel is not built for `arch`.
    pub fn refusal(&self, arch: Arch) -> anyhow::Error {
        let list: Vec<&str> = self.archs.iter().map(|a| a.name()).collect();
        anyhow!(
            "{}/{} is built only for [{}], not {arch}{}",
            self.block,
            self.name,
            list.join(", "),
            if self.archs == [Arch::Sm90a] {
                ": it uses Hopper's architecture-specific instructions (wgmma / setmaxnreg), which need sm_90a"
            } else {
                ""
            }
        )
    }

    /// Compiles this kernel's source for `arch` and returns the cubin with this kernel's resources checked present.
    /// An architecture the kernel does not list is refused by name, before NVRTC sees it.
    pub fn compile(&self, arch: Arch) -> Result<(Arc<Cubin>, Resources)> {
        if !self.archs.contains(&arch) {
            return Err(self.refusal(arch));
        }
        let cubin =
            compile(self.source, arch, &[]).map_err(|e| match e.downcast::<CompileError>() {
                Ok(mut ce) => {
                    ce.kernel = Some(self.name.to_string());
                    anyhow::Error::new(ce)
                }
                Err(other) => other,
            })?;
        let r = cubin.kernel(self.name)?.clone();
        Ok((cubin, r))
    }

    /// This kernel with the first `from` in header `header` replaced by `to`: a deliberately broken variant for
    /// mutation tests, made without a toggle in the sources. Fails if the text is no longer there.
    pub fn mutated(&self, header: &str, from: &str, to: &str) -> Result<KernelSpec> {
        let mut hit = false;
        let mut sets: Vec<&'static [Header]> = Vec::new();
        for set in self.source.headers {
            let mut hs = set.to_vec();
            for h in hs.iter_mut().filter(|h| h.name == header) {
                if !h.code.contains(from) {
                    return Err(anyhow!(
                        "mutation `{from}` no longer applies to {header}: update the test"
                    ));
                }
                h.code = Box::leak(h.code.replacen(from, to, 1).into_boxed_str());
                hit = true;
            }
            sets.push(Box::leak(hs.into_boxed_slice()));
        }
        if !hit {
            return Err(anyhow!("{header} is not a header of `{}`", self.name));
        }
        let headers: &'static [&'static [Header]] = Box::leak(sets.into_boxed_slice());
        let source: &'static Source = Box::leak(Box::new(Source {
            headers,
            ..*self.source
        }));
        Ok(KernelSpec { source, ..*self })
    }

    /// The kernel with its own source file's text edited (the first `from` becomes `to`), for kernels whose
    /// logic lives in the `.cu` file rather than a header.
    pub fn mutated_source(&self, from: &str, to: &str) -> Result<KernelSpec> {
        if !self.source.code.contains(from) {
            return Err(anyhow!(
                "mutation `{from}` no longer applies to {}: update the test",
                self.source.file
            ));
        }
        let source: &'static Source = Box::leak(Box::new(Source {
            code: Box::leak(self.source.code.replacen(from, to, 1).into_boxed_str()),
            ..*self.source
        }));
        Ok(KernelSpec { source, ..*self })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_entries_round_trip_and_keys_tell_sources_apart() -> Result<()> {
        let src = crate::hello::SOURCE;
        let tc = crate::toolchain::toolchain()?;
        let opts = options(Arch::Sm80, &tc.include, &[]);
        let c = compile_with(&src, Arch::Sm80, &opts)?;
        let dir = std::env::temp_dir().join(format!("lab-cubin-cache-{}", std::process::id()));
        let stem = dir.join(disk_key(&src, Arch::Sm80, &opts, "tc"));
        assert!(load_disk(&stem, &src, Arch::Sm80, &opts).is_none());
        store_disk(&stem, &c)?;
        let back = load_disk(&stem, &src, Arch::Sm80, &opts).expect("stored");
        assert_eq!((&back.image, &back.resources), (&c.image, &c.resources));
        // Entries of the same file name under other keys live in other files: storing one leaves the first
        // as it was, and each loads its own (a mutant once loaded the original's cubin this way).
        let other = dir.join(disk_key(&src, Arch::Sm89, &opts, "tc"));
        let fake = Cubin {
            image: vec![1, 2, 3],
            ..c.clone()
        };
        store_disk(&other, &fake)?;
        assert_eq!(
            load_disk(&other, &src, Arch::Sm89, &opts)
                .expect("stored")
                .image,
            vec![1, 2, 3]
        );
        assert_eq!(
            load_disk(&stem, &src, Arch::Sm80, &opts)
                .expect("kept")
                .image,
            c.image
        );
        assert_eq!(
            std::fs::read_dir(&dir)?.count(),
            4,
            "two entries, a cubin and a log each"
        );
        let _ = std::fs::remove_dir_all(&dir);
        // Another architecture, option, toolchain or header text is another entry.
        let k = disk_key(&src, Arch::Sm80, &opts, "tc");
        assert_ne!(k, disk_key(&src, Arch::Sm89, &opts, "tc"));
        assert_ne!(k, disk_key(&src, Arch::Sm80, &opts[1..], "tc"));
        assert_ne!(k, disk_key(&src, Arch::Sm80, &opts, "other"));
        let edited = Source {
            code: "// edited\n",
            ..src
        };
        assert_ne!(k, disk_key(&edited, Arch::Sm80, &opts, "tc"));
        Ok(())
    }
}
