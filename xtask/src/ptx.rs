//! `cargo xtask ptx [--check]`: compile every `kernels/*.cu` with NVRTC for
//! `compute_52` into `crates/m40-kernels/ptx/NAME.ptx.zst` (zstd level 19:
//! the PTX travels inside m40-kernels' package, ~9x smaller than its text),
//! list each module's kernels in `ptx/index.txt`, and write
//! `ptxas -arch=sm_52 -v`'s resource report (registers, spills, shared
//! memory) to `ptx/NAME.sm_52.txt`. `--check` regenerates into memory and
//! fails if anything differs from what is committed (the PTX compared as
//! text, so another zstd version's bytes do not count as a change). Without `--check`, each
//! source is compiled REPRO_RUNS more times after all of them, and a source
//! whose PTX differs between compilations is an error: the check could not
//! pass reliably (NVRTC 11.8's vectorizer chose differently from run to run
//! for plain float4 shared loads in attention.cuh's unrolled loops; see
//! `attn_lds4` there).
//!
//! The toolchain comes from PyPI, installed into `target/cuda-tools` on first
//! use: NVRTC 11.8 (`nvidia-cuda-nvrtc-cu11`, PTX ISA 7.8, which drivers from
//! R520 accept), the CUDA headers (`nvidia-cuda-runtime-cu11`) and ptxas
//! (`nvidia-cuda-nvcc-cu12`). No GPU is needed.

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;

const PACKAGES: &[&str] = &[
    "nvidia-cuda-nvrtc-cu11==11.8.89",
    "nvidia-cuda-runtime-cu11==11.8.89",
    "nvidia-cuda-nvcc-cu12==12.9.86",
];
const ARCH: &str = "compute_52";
/// Where the PTX, its index and the reports go, from the workspace root.
const OUT_DIR: &str = "crates/m40-kernels/ptx";
/// zstd level of the committed PTX (decompressed once per module at load).
const ZSTD_LEVEL: i32 = 19;
/// Extra compilations of each source that must give the same PTX.
const REPRO_RUNS: usize = 2;

type Result<T> = std::result::Result<T, String>;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The PyPI toolchain, installed on first use.
fn tools() -> Result<PathBuf> {
    let dir = root().join("target/cuda-tools");
    if !dir.join("nvidia/cuda_nvrtc/lib").is_dir()
        || !dir.join("nvidia/cuda_nvcc/bin/ptxas").is_file()
    {
        eprintln!(
            "installing NVRTC, CUDA headers and ptxas from PyPI into {}",
            dir.display()
        );
        let python = std::env::var("M40_PYTHON").unwrap_or_else(|_| "python3".into());
        let ok = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--target",
            ])
            .arg(&dir)
            .args(PACKAGES)
            .status()
            .map_err(|e| format!("running {python} -m pip: {e}"))?
            .success();
        if !ok {
            return Err(format!("pip install {} failed", PACKAGES.join(" ")));
        }
    }
    Ok(dir)
}

type Prog = *mut std::ffi::c_void;

/// NVRTC, loaded from the PyPI wheel.
struct Nvrtc {
    _lib: libloading::Library,
    create: unsafe extern "C" fn(
        *mut Prog,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile: unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> c_int,
    log_size: unsafe extern "C" fn(Prog, *mut usize) -> c_int,
    log: unsafe extern "C" fn(Prog, *mut c_char) -> c_int,
    ptx_size: unsafe extern "C" fn(Prog, *mut usize) -> c_int,
    ptx: unsafe extern "C" fn(Prog, *mut c_char) -> c_int,
    destroy: unsafe extern "C" fn(*mut Prog) -> c_int,
}

impl Nvrtc {
    fn load(tools: &Path) -> Result<Self> {
        let lib_dir = tools.join("nvidia/cuda_nvrtc/lib");
        let path = std::fs::read_dir(&lib_dir)
            .map_err(|e| format!("{}: {e}", lib_dir.display()))?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("libnvrtc.so"))
            })
            .ok_or_else(|| format!("no libnvrtc.so in {}", lib_dir.display()))?;
        // SAFETY: loading NVRTC runs its initializers, which have no preconditions.
        let lib = unsafe { libloading::Library::new(&path) }
            .map_err(|e| format!("loading {}: {e}", path.display()))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol has the C signature NVRTC's nvrtc.h declares for it.
                *unsafe { lib.get($name) }
                    .map_err(|e| format!("{}: {e}", String::from_utf8_lossy($name)))?
            };
        }
        Ok(Self {
            create: sym!(b"nvrtcCreateProgram"),
            compile: sym!(b"nvrtcCompileProgram"),
            log_size: sym!(b"nvrtcGetProgramLogSize"),
            log: sym!(b"nvrtcGetProgramLog"),
            ptx_size: sym!(b"nvrtcGetPTXSize"),
            ptx: sym!(b"nvrtcGetPTX"),
            destroy: sym!(b"nvrtcDestroyProgram"),
            _lib: lib,
        })
    }

    fn compile_to_ptx(&self, src: &str, name: &str, options: &[String]) -> Result<String> {
        let src = CString::new(src).map_err(|e| e.to_string())?;
        let cname = CString::new(name).map_err(|e| e.to_string())?;
        let opts: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()).expect("options have no NUL"))
            .collect();
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Prog = std::ptr::null_mut();
        // SAFETY: all pointers are valid C strings for the duration of the calls;
        // buffers are sized by the matching *Size calls; the program is destroyed once.
        unsafe {
            if (self.create)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            ) != 0
            {
                return Err(format!("nvrtcCreateProgram failed for {name}"));
            }
            let rc = (self.compile)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr());
            let mut n = 0usize;
            (self.log_size)(prog, &mut n);
            let mut log = vec![0u8; n.max(1)];
            (self.log)(prog, log.as_mut_ptr() as *mut c_char);
            let log = CStr::from_bytes_until_nul(&log)
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_default();
            if rc != 0 {
                (self.destroy)(&mut prog);
                return Err(format!("NVRTC could not compile {name}:\n{log}"));
            }
            (self.ptx_size)(prog, &mut n);
            let mut ptx = vec![0u8; n];
            (self.ptx)(prog, ptx.as_mut_ptr() as *mut c_char);
            (self.destroy)(&mut prog);
            Ok(CStr::from_bytes_until_nul(&ptx)
                .map_err(|e| e.to_string())?
                .to_string_lossy()
                .into_owned())
        }
    }
}

/// The compilation units of a source: itself as module `stem`, or, where
/// its first line says `// m40-parts: A B ...`, one per part as module
/// `stem.A` with `M40_PART` defined as the part (`M40_PART_COMMON` for the
/// part named `common`), so that a model loads (and the driver
/// JIT-compiles) only the parts of the formats it holds.
fn units(stem: &str, code: &str) -> Vec<(String, String)> {
    let parts = code
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("// m40-parts:"));
    match parts {
        None => vec![(stem.to_string(), code.to_string())],
        Some(parts) => parts
            .split_whitespace()
            .map(|p| {
                let define = if p == "common" {
                    "#define M40_PART_COMMON".to_string()
                } else {
                    format!("#define M40_PART {p}")
                };
                (format!("{stem}.{p}"), format!("{define}\n{code}"))
            })
            .collect(),
    }
}

/// The text of a committed output (a `.zst` decompressed), if it exists.
fn committed(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    let text = if path.extension().is_some_and(|e| e == "zst") {
        zstd::decode_all(&bytes[..]).ok()?
    } else {
        bytes
    };
    String::from_utf8(text).ok()
}

/// Write an output: a `.zst` compressed at [`ZSTD_LEVEL`], text as is.
fn write_output(path: &Path, text: &str) -> Result<()> {
    let bytes = if path.extension().is_some_and(|e| e == "zst") {
        zstd::encode_all(text.as_bytes(), ZSTD_LEVEL).map_err(|e| e.to_string())?
    } else {
        text.as_bytes().to_vec()
    };
    std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// `MODULE KERNEL...`: the kernels (`.entry` names) a module's PTX defines,
/// so that m40-kernels finds a kernel's module without decompressing any.
fn index_line(module: &str, ptx: &str) -> String {
    let mut line = module.to_string();
    for l in ptx.lines() {
        if let Some(name) = l.trim_start().strip_prefix(".visible .entry ") {
            line.push(' ');
            line.push_str(name.trim_end_matches('('));
        }
    }
    line.push('\n');
    line
}

fn ptxas_report(tools: &Path, ptx: &Path) -> Result<String> {
    let ptxas = tools.join("nvidia/cuda_nvcc/bin/ptxas");
    let out = Command::new(&ptxas)
        .args(["-arch=sm_52", "-v", "-o", "/dev/null"])
        .arg(ptx)
        .output()
        .map_err(|e| format!("running {}: {e}", ptxas.display()))?;
    let text = String::from_utf8_lossy(&out.stderr).replace(
        &ptx.display().to_string(),
        &ptx.file_name().unwrap().to_string_lossy(),
    );
    if !out.status.success() {
        return Err(format!("ptxas rejected {}:\n{text}", ptx.display()));
    }
    // Drop the compile time: the report must be reproducible.
    Ok(text
        .lines()
        .filter(|l| !l.contains("Compile time"))
        .map(|l| format!("{l}\n"))
        .collect())
}

/// The function (`.entry` name) of the first line where two compilations'
/// PTX differ, ignoring the call-sequence numbers in comments; None if they
/// agree.
fn first_difference(a: &str, b: &str) -> Option<String> {
    let norm = |l: &str| match l.find("// callseq") {
        Some(i) => l[..i].to_string(),
        None => l.to_string(),
    };
    let mut entry = String::from("the module header");
    let (mut la, mut lb) = (a.lines(), b.lines());
    loop {
        match (la.next(), lb.next()) {
            (None, None) => return None,
            (Some(x), Some(y)) if norm(x) == norm(y) => {
                if let Some(name) = x.strip_prefix(".visible .entry ") {
                    entry = name.trim_end_matches('(').to_string();
                }
            }
            _ => return Some(entry),
        }
    }
}

pub fn run(check: bool) -> Result<()> {
    let root = root();
    let kernels = root.join("kernels");
    let out_dir = root.join(OUT_DIR);
    let tools = tools()?;
    let nvrtc = Nvrtc::load(&tools)?;
    let include = tools.join("nvidia/cuda_runtime/include");
    let options = vec![
        format!("--gpu-architecture={ARCH}"),
        "--std=c++14".to_string(),
        format!("--include-path={}", kernels.display()),
        format!("--include-path={}", include.display()),
        "--use_fast_math".to_string(),
        "--fmad=true".to_string(),
    ];
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&kernels)
        .map_err(|e| format!("{}: {e}", kernels.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    sources.sort();
    std::fs::create_dir_all(&out_dir).map_err(|e| e.to_string())?;
    let tmp = root.join("target/ptx-check");
    std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
    let mut stale = Vec::new();
    let mut compiled = Vec::new();
    let mut expected = Vec::new();
    let mut index = String::new();
    for src in &sources {
        let stem = src.file_stem().unwrap().to_string_lossy().into_owned();
        let code = std::fs::read_to_string(src).map_err(|e| format!("{}: {e}", src.display()))?;
        // One report per source; one PTX module per part.
        let mut report = String::new();
        let mut outputs = Vec::new();
        for (module, unit) in units(&stem, &code) {
            let ptx = nvrtc.compile_to_ptx(&unit, &format!("{stem}.cu"), &options)?;
            if !check {
                compiled.push((module.clone(), stem.clone(), unit.clone(), ptx.clone()));
            }
            let scratch = tmp.join(format!("{module}.ptx"));
            std::fs::write(&scratch, &ptx).map_err(|e| e.to_string())?;
            report.push_str(&ptxas_report(&tools, &scratch)?);
            index.push_str(&index_line(&module, &ptx));
            outputs.push((format!("{module}.ptx.zst"), ptx));
        }
        outputs.push((format!("{stem}.sm_52.txt"), report));
        for (file, text) in outputs {
            let dest = out_dir.join(&file);
            expected.push(file.clone());
            if committed(&dest).is_none_or(|old| old != text) {
                if check {
                    stale.push(file);
                } else {
                    write_output(&dest, &text)?;
                    eprintln!("wrote {OUT_DIR}/{file}");
                }
            }
        }
    }
    let dest = out_dir.join("index.txt");
    expected.push("index.txt".into());
    if committed(&dest).is_none_or(|old| old != index) {
        if check {
            stale.push("index.txt".into());
        } else {
            write_output(&dest, &index)?;
            eprintln!("wrote {OUT_DIR}/index.txt");
        }
    }
    // Files no source makes any more (a source split into parts, or removed).
    for e in std::fs::read_dir(&out_dir)
        .map_err(|e| e.to_string())?
        .flatten()
    {
        let file = e.file_name().to_string_lossy().into_owned();
        let ours = file.ends_with(".ptx.zst") || file.ends_with(".sm_52.txt");
        if ours && !expected.contains(&file) {
            if check {
                stale.push(format!("{file} (no source makes it: delete it)"));
            } else {
                std::fs::remove_file(e.path()).map_err(|e| e.to_string())?;
                eprintln!("removed {OUT_DIR}/{file}");
            }
        }
    }
    if !stale.is_empty() {
        return Err(format!(
            "{OUT_DIR} is stale (run `cargo xtask ptx` and commit): {}",
            stale.join(", ")
        ));
    }
    // After every first compilation (NVRTC numbers its call sequences across
    // the compilations of a process, so these come last and that number is
    // left out of the comparison).
    for (module, stem, code, ptx) in &compiled {
        for _ in 0..REPRO_RUNS {
            let again = nvrtc.compile_to_ptx(code, &format!("{stem}.cu"), &options)?;
            if let Some(f) = first_difference(ptx, &again) {
                return Err(format!(
                    "NVRTC gave kernels/{stem}.cu ({module}) different PTX in two compilations (in {f}): \
                     `--check` could not pass reliably; give the loads it vectorizes a fixed \
                     shape (attention.cuh's attn_lds4)"
                ));
            }
        }
    }
    eprintln!(
        "{} kernel source(s) {}",
        sources.len(),
        if check {
            "match their committed PTX"
        } else {
            "compiled"
        }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{first_difference, index_line, units};

    #[test]
    fn the_index_lists_each_entry() {
        let ptx = ".version 7.8\n.visible .entry f(\n.param .u64 a\n)\n{\n}\n.visible .entry g_x4(\n)\n{\n}\n";
        assert_eq!(index_line("gemv.q4_0", ptx), "gemv.q4_0 f g_x4\n");
        assert_eq!(index_line("empty", ".version 7.8\n"), "empty\n");
    }

    #[test]
    fn sources_split_into_the_parts_their_first_line_names() {
        assert_eq!(
            units("rope", "// plain\nx"),
            [("rope".to_string(), "// plain\nx".to_string())]
        );
        let code = "// m40-parts: common q4_0\nbody";
        let u = units("gemm", code);
        assert_eq!(u.len(), 2);
        assert_eq!(
            u[0],
            (
                "gemm.common".into(),
                format!("#define M40_PART_COMMON\n{code}")
            )
        );
        assert_eq!(
            u[1],
            ("gemm.q4_0".into(), format!("#define M40_PART q4_0\n{code}"))
        );
    }

    #[test]
    fn first_difference_names_the_function_and_skips_call_sequences() {
        let a = ".version 7.8\n.visible .entry f(\n{ // callseq 1, 0\nld.shared.f32 %f1, [%r1];\n}\n.visible .entry g(\nadd.f32 %f1, %f2, %f3;\n";
        let same = a.replace("callseq 1, 0", "callseq 7, 0");
        assert_eq!(first_difference(a, &same), None);
        let other = a.replace("add.f32 %f1", "add.f32 %f4");
        assert_eq!(first_difference(a, &other).as_deref(), Some("g"));
        assert_eq!(
            first_difference(a, &a[..20]).as_deref(),
            Some("the module header")
        );
    }
}
