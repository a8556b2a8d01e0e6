// Finds CUDA headers and NVRTC: CUDA_HOME / CUDA_PATH / /usr/local/cuda, else NVIDIA's pip wheels in .toolchain/.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

/// The pip wheels that make a CPU-only machine able to compile kernels (about 230 MB unpacked).
/// Pinned: a different NVRTC changes the generated code, and with it the committed resource budgets.
pub const WHEELS: &[&str] = &[
    "nvidia-cuda-nvrtc==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-crt==13.0.88",
];

/// A usable CUDA installation: where the headers are, and the NVRTC library if it is not on the loader's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toolchain {
    /// The directory holding `cuda_fp16.h`, `mma.h` and `crt/`.
    pub include: PathBuf,
    /// `libnvrtc.so.13` by absolute path, when the root has one; `None` means the system loader finds it.
    pub nvrtc: Option<PathBuf>,
    /// Where it came from, for messages.
    pub origin: String,
}

/// What discovery looks at. A value, so that discovery can be tested without touching the real environment.
#[derive(Debug, Clone)]
pub struct Probe {
    pub cuda_home: Option<PathBuf>,
    pub cuda_path: Option<PathBuf>,
    pub system_roots: Vec<PathBuf>,
    /// The project-local folder the wheels are installed into.
    pub local: PathBuf,
    /// Whether discovery may run `pip install` into `local` when nothing else is found.
    pub may_install: bool,
}

impl Probe {
    /// The real environment. `LAB_TOOLCHAIN_DIR` moves the local folder; `LAB_NO_INSTALL=1` forbids the install.
    pub fn from_env() -> Self {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Probe {
            cuda_home: var("CUDA_HOME"),
            cuda_path: var("CUDA_PATH"),
            system_roots: vec![PathBuf::from("/usr/local/cuda")],
            local: var("LAB_TOOLCHAIN_DIR").unwrap_or_else(default_local_dir),
            may_install: std::env::var("LAB_NO_INSTALL")
                .map(|v| v != "1")
                .unwrap_or(true),
        }
    }
}

/// `<workspace>/.toolchain/cuda-13.0`, fixed at build time: the test binaries of one checkout share it.
pub fn default_local_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.toolchain/cuda-13.0")
}

/// A root is usable if it has the headers NVRTC needs to compile `mma.h` code.
fn inspect_root(root: &Path, origin: &str) -> Option<Toolchain> {
    let root = &root.canonicalize().ok()?;
    let include = [root.join("include"), root.join("nvidia/cu13/include")]
        .into_iter()
        .find(|d| d.join("cuda_fp16.h").is_file() && d.join("crt/host_defines.h").is_file())?;
    let libdirs = [
        root.join("lib64"),
        root.join("lib"),
        root.join("targets/x86_64-linux/lib"),
        root.join("nvidia/cu13/lib"),
    ];
    let nvrtc = libdirs
        .iter()
        .map(|d| d.join("libnvrtc.so.13"))
        .find(|p| p.is_file());
    Some(Toolchain {
        include,
        nvrtc,
        origin: format!("{origin} ({})", root.display()),
    })
}

/// Discovery without side effects beyond the optional install. Every place looked at is named in the error.
pub fn discover(probe: &Probe) -> Result<Toolchain> {
    let mut looked = Vec::new();
    let mut candidates: Vec<(PathBuf, String)> = Vec::new();
    match &probe.cuda_home {
        Some(p) => candidates.push((p.clone(), "CUDA_HOME".into())),
        None => looked.push("CUDA_HOME (unset)".to_string()),
    }
    match &probe.cuda_path {
        Some(p) => candidates.push((p.clone(), "CUDA_PATH".into())),
        None => looked.push("CUDA_PATH (unset)".to_string()),
    }
    for r in &probe.system_roots {
        candidates.push((r.clone(), "system".into()));
    }
    candidates.push((probe.local.clone(), "pip wheels".into()));
    for (root, origin) in &candidates {
        if let Some(tc) = inspect_root(root, origin) {
            return Ok(tc);
        }
        looked.push(format!(
            "{origin} {} (no CUDA headers there)",
            root.display()
        ));
    }
    let install_note = if probe.may_install {
        match install_wheels(&probe.local) {
            Ok(()) => {
                if let Some(tc) = inspect_root(&probe.local, "pip wheels") {
                    return Ok(tc);
                }
                "the wheels installed but hold no usable headers".to_string()
            }
            Err(e) => format!("installing the wheels failed: {e:#}"),
        }
    } else {
        "installing the wheels is disabled (LAB_NO_INSTALL=1)".to_string()
    };
    bail!(
        "no CUDA toolkit found. Looked at: {}. {install_note}.\n\
         Install the CUDA 13 toolkit and set CUDA_HOME, or let the lab install NVIDIA's wheels with \
         `python3 -m pip install --target {} {}`.",
        looked.join("; "),
        probe.local.display(),
        WHEELS.join(" ")
    )
}

/// Installs the wheels into `dir`, once, under a file lock, so that parallel test binaries do not race.
pub fn install_wheels(dir: &Path) -> Result<()> {
    install_into(dir, WHEELS, |d| inspect_root(d, "pip wheels").is_some())
}

/// Installs `wheels` into `dir` unless `done(dir)` already holds; under a file lock, through a staging folder.
pub fn install_into(dir: &Path, wheels: &[&str], done: impl Fn(&Path) -> bool) -> Result<()> {
    let parent = dir.parent().context("toolchain dir has no parent")?;
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let lock_path = parent.join(".install.lock");
    let lock = std::fs::File::create(&lock_path)
        .with_context(|| format!("creating {}", lock_path.display()))?;
    lock.lock().context("locking the toolchain folder")?;
    if done(dir) {
        return Ok(());
    }
    let staging = parent.join(".staging");
    let _ = std::fs::remove_dir_all(&staging);
    eprintln!(
        "lab: installing {} into {}",
        wheels.join(", "),
        dir.display()
    );
    let python = std::env::var("LAB_PYTHON").unwrap_or_else(|_| "python3".into());
    let status = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--target",
        ])
        .arg(&staging)
        .args(wheels)
        .status()
        .with_context(|| format!("running `{python} -m pip` (is Python 3 with pip installed?)"))?;
    if !status.success() {
        bail!("`{python} -m pip install` exited with {status}");
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::rename(&staging, dir)
        .with_context(|| format!("moving wheels into {}", dir.display()))?;
    Ok(())
}

/// The process-wide toolchain, found once; NVRTC is preloaded by absolute path so that cudarc's
/// `dlopen("libnvrtc.so.13")` resolves to it by soname without `LD_LIBRARY_PATH`.
pub fn toolchain() -> Result<&'static Toolchain> {
    static TC: OnceLock<std::result::Result<Toolchain, String>> = OnceLock::new();
    TC.get_or_init(|| {
        let tc = discover(&Probe::from_env()).map_err(|e| format!("{e:#}"))?;
        if let Some(lib) = &tc.nvrtc {
            // NVRTC dlopens its builtins by bare name, so they are preloaded from the same folder first.
            let builtins = lib.with_file_name("libnvrtc-builtins.so.13.0");
            for l in [&builtins, lib] {
                if !l.is_file() {
                    continue;
                }
                // SAFETY: loading NVIDIA's NVRTC runs its initialisers, which have no preconditions.
                let h = unsafe { libloading::Library::new(l) }.map_err(|e| format!("loading {}: {e}", l.display()))?;
                std::mem::forget(h); // keep it loaded for the life of the process
            }
        }
        // SAFETY: only checks whether the library can be opened.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(format!(
                "CUDA headers found via {}, but libnvrtc.so.13 cannot be loaded: add the toolkit's lib64 \
                 to LD_LIBRARY_PATH or install the wheels ({})",
                tc.origin,
                WHEELS.join(" ")
            ));
        }
        Ok(tc)
    })
    .as_ref()
    .map_err(|e| anyhow::anyhow!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty_probe(dir: &Path) -> Probe {
        Probe {
            cuda_home: None,
            cuda_path: None,
            system_roots: vec![dir.join("no-such-cuda")],
            local: dir.join("no-such-toolchain"),
            may_install: false,
        }
    }

    #[test]
    fn no_cuda_gives_one_error_naming_every_place_and_the_fix() {
        let tmp = std::env::temp_dir().join(format!("lab-tc-{}", std::process::id()));
        let err = discover(&empty_probe(&tmp)).unwrap_err().to_string();
        assert!(err.contains("no CUDA toolkit found"), "{err}");
        assert!(err.contains("CUDA_HOME (unset)"), "{err}");
        assert!(err.contains("no-such-cuda"), "{err}");
        assert!(err.contains("LAB_NO_INSTALL=1"), "{err}");
        assert!(err.contains("nvidia-cuda-nvrtc==13.0.88"), "{err}");
    }

    #[test]
    fn a_root_with_headers_and_nvrtc_is_found_first_from_cuda_home() {
        let tmp = std::env::temp_dir().join(format!("lab-tc-home-{}", std::process::id()));
        std::fs::create_dir_all(tmp.join("include/crt")).unwrap();
        std::fs::create_dir_all(tmp.join("lib64")).unwrap();
        std::fs::write(tmp.join("include/cuda_fp16.h"), "").unwrap();
        std::fs::write(tmp.join("include/crt/host_defines.h"), "").unwrap();
        std::fs::write(tmp.join("lib64/libnvrtc.so.13"), "").unwrap();
        let mut probe = empty_probe(&tmp);
        probe.cuda_home = Some(tmp.clone());
        let tc = discover(&probe).unwrap();
        assert_eq!(tc.include, tmp.join("include"));
        assert_eq!(tc.nvrtc, Some(tmp.join("lib64/libnvrtc.so.13")));
        assert!(tc.origin.starts_with("CUDA_HOME"));
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
