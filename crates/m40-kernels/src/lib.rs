//! The CUDA kernels of m40-llm and one launcher per kernel.
//!
//! The PTX in this package's `ptx/` (compiled from the repository's
//! `kernels/*.cu` for compute_52 by `cargo xtask ptx`, committed compressed
//! with zstd) is embedded here with `include_bytes!`; each module is
//! decompressed and loaded into a device the first time one of its kernels
//! is launched there ([`Kernels`] holds one per device). Every launcher owns its
//! kernel's grid math (block sizes are named constants mirroring the `.cu`
//! file) and checks what the kernel assumes: buffer lengths, alignment, the
//! 48 KB of shared memory a block may have on sm_52. Kernels know nothing of
//! models: shapes come in as numbers.

// One module per kernels/*.cu, named as it is: its constants, plan,
// argument structs and launchers.
mod attention;
mod bench;
mod decode;
mod elementwise;
mod embed;
mod encoder;
mod gemm;
mod gemm_rows;
mod gemv;
mod gemv_packed;
mod moe;
mod rmsnorm;
mod rope;
mod sample;

// What they share: errors, the quant formats' layouts (quant.cuh), the
// packed layout (packed.cuh), operand layouts, launch helpers.
mod error;
mod format;
mod launch;
mod layout;
mod pack;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use m40_device::{Device, Kernel, Module};

pub use attention::{
    attn_decodes, attn_shared_bytes, AttnInputs, AttnPlan, AttnScratch, AttnShape, Scores,
    MAX_HEAD_DIM,
};
pub use decode::DecodeProgram;
pub use encoder::{EncAttnInputs, EncHeads, ENC_MAX_KEYS};
pub use error::{KernelError, Result};
pub use format::{gemv_shared_bytes, KernelFormat};
pub use gemm::{
    gemm_large_tiles, gemm_plan, gemm_scratch_len, GemmOpts, GemmPlan, GemmSlots, GemmTile,
    GEMM_SPLITS_LIMIT, MOE_GEMM_TILES,
};
pub use gemv::GemvPlan;
pub use gemv_packed::{Fold, GemvLaunch, GemvOpts, GemvOut, RopeKv, PACKED_GEMV_MAX_TOKENS};
pub use layout::{KvType, PackedMatrix, QMatrix, RowSplit, KV_PAGE};
pub use moe::{
    moe_tile_bound, CombineFold, ExpertGlu, ExpertTiles, MoeShape, RouterNorm, RouterRoute,
    MOE_GEMV_TILE, MOE_MAX_EXPERTS, MOE_ROUTER_MAX_ROWS, MOE_ROUTER_TOKENS,
};
pub use pack::{interleave_glu, pack_gemv, PackFormat, PACK_ROWS};
pub use rmsnorm::{AddResidual, PostNorm};
pub use rope::{HeadNorms, KvAppend, RopeParams, RopeStyle};
pub use sample::{
    draw_args, select_args, select_masked, DrawRows, Penalties, SelectMasks, SelectOut, SelectRows,
    DRAW_ARGS, SELECT_ARGS, SELECT_MAX_K, SELECT_SCRATCH,
};

/// Shared memory a block may use on sm_52 (and without opt-in on any GPU).
pub(crate) const MAX_SHARED_PER_BLOCK: usize = 48 * 1024;

/// Module `NAME`: its name and `ptx/NAME.ptx.zst`.
macro_rules! module {
    ($name:literal) => {
        PtxModule {
            name: $name,
            zst: include_bytes!(concat!("../ptx/", $name, ".ptx.zst")),
        }
    };
}

/// One PTX module as embedded: zstd-compressed text.
pub struct PtxModule {
    pub name: &'static str,
    zst: &'static [u8],
}

impl PtxModule {
    /// The PTX text (decompressed now: each device loads a module once, and
    /// the text is dropped once the driver has it).
    pub fn text(&self) -> Result<String> {
        use std::io::Read;
        let corrupt = |what: String| KernelError::Shape {
            kernel: self.name,
            what: format!("the embedded PTX does not decompress: {what}"),
        };
        let mut text = String::new();
        ruzstd::decoding::StreamingDecoder::new(self.zst)
            .map_err(|e| corrupt(e.to_string()))?
            .read_to_string(&mut text)
            .map_err(|e| corrupt(e.to_string()))?;
        Ok(text)
    }

    /// Bytes of the compressed PTX.
    pub fn compressed_len(&self) -> usize {
        self.zst.len()
    }
}

/// `MODULE KERNEL...` per line: the kernels each module defines
/// (written with the PTX by `cargo xtask ptx`).
const INDEX: &str = include_str!("../ptx/index.txt");

/// The PTX modules, one per `kernels/*.cu`, or, for a source
/// compiled in parts (its `// m40-parts:` line), one per part, named
/// `STEM.PART` (`gemm.q4_1`): a model loads, and the driver JIT-compiles on
/// a first run, only the parts of its formats.
///
/// A `static`: the megabytes of PTX are in the binary once (a `const` is
/// copied at each place it is used).
pub static MODULES: &[PtxModule] = MODULE_TABLE;

/// [`MODULES`] as a constant, for its length only.
const MODULE_TABLE: &[PtxModule] = &[
    module!("attention"),
    module!("bench"),
    module!("decode"),
    module!("elementwise"),
    module!("embed"),
    module!("encoder"),
    module!("gemm.common"),
    module!("gemm.f32"),
    module!("gemm.f16"),
    module!("gemm.bf16"),
    module!("gemm.q8_0"),
    module!("gemm.q4_0"),
    module!("gemm.q4_1"),
    module!("gemm.q5_0"),
    module!("gemm.q5_1"),
    module!("gemm.q2_k"),
    module!("gemm.q3_k"),
    module!("gemm.q4_k"),
    module!("gemm.q5_k"),
    module!("gemm.q6_k"),
    module!("gemm.iq4_nl"),
    module!("gemm.iq4_xs"),
    module!("gemm.mxfp4"),
    module!("gemm_rows.f16"),
    module!("gemm_rows.q8_0"),
    module!("gemm_rows.q4_0"),
    module!("gemm_rows.q4_1"),
    module!("gemm_rows.q4_k"),
    module!("gemm_rows.q6_k"),
    module!("gemm_rows.mxfp4"),
    module!("gemv.f32"),
    module!("gemv.f16"),
    module!("gemv.bf16"),
    module!("gemv.q8_0"),
    module!("gemv.q4_0"),
    module!("gemv.q4_1"),
    module!("gemv.q5_0"),
    module!("gemv.q5_1"),
    module!("gemv.q2_k"),
    module!("gemv.q3_k"),
    module!("gemv.q4_k"),
    module!("gemv.q5_k"),
    module!("gemv.q6_k"),
    module!("gemv.iq4_nl"),
    module!("gemv.iq4_xs"),
    module!("gemv.mxfp4"),
    module!("gemv_packed.f16"),
    module!("gemv_packed.q8_0"),
    module!("gemv_packed.q4_0"),
    module!("gemv_packed.q4_1"),
    module!("gemv_packed.q4_k"),
    module!("gemv_packed.q6_k"),
    module!("gemv_packed.mxfp4"),
    module!("moe"),
    module!("rmsnorm"),
    module!("rope"),
    module!("sample"),
];

/// The kernels of one device; modules load on first use, and each kernel's
/// handle is looked up once (a launch costs no driver lookup).
pub struct Kernels {
    device: Arc<Device>,
    modules: [OnceLock<Module>; MODULE_TABLE.len()],
    handles: Mutex<HashMap<&'static str, Kernel>>,
    /// Blocks of a kernel the whole GPU holds at once, by kernel name,
    /// threads per block and dynamic shared memory.
    resident: Mutex<HashMap<(&'static str, u32, u32), usize>>,
    /// The decode program being recorded, if any (decode.rs).
    recorder: Mutex<Option<decode::Recorder>>,
}

impl Kernels {
    pub fn new(device: Arc<Device>) -> Self {
        Self {
            device,
            modules: std::array::from_fn(|_| OnceLock::new()),
            handles: Mutex::new(HashMap::new()),
            resident: Mutex::new(HashMap::new()),
            recorder: Mutex::new(None),
        }
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Kernel `name` of module `module` (loading the module if needed), to
    /// launch now: while a decode program records, the ops recorded so far
    /// are launched first (they come before this launch).
    pub fn kernel(&self, module: &'static str, name: &'static str) -> Result<Kernel> {
        self.flush_recorded()?;
        self.handle(module, name)
    }

    /// Kernel `name` of module `module`, looked up once.
    pub(crate) fn handle(&self, module: &'static str, name: &'static str) -> Result<Kernel> {
        let mut handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = handles.get(name) {
            return Ok(k.clone());
        }
        let k = self.lookup(module, name)?;
        handles.insert(name, k.clone());
        Ok(k)
    }

    /// Blocks of `threads` threads of `kernel`, each with `shared_bytes` of
    /// dynamic shared memory, that the GPU holds at once (SMs x the
    /// occupancy calculator's blocks per SM), looked up once.
    pub(crate) fn resident_blocks(
        &self,
        kernel: &Kernel,
        threads: u32,
        shared_bytes: u32,
    ) -> Result<usize> {
        let mut resident = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        let key = (kernel.name(), threads, shared_bytes);
        if let Some(&n) = resident.get(&key) {
            return Ok(n);
        }
        let per_sm = kernel
            .max_active_blocks_per_sm_with(threads, shared_bytes)?
            .max(1) as usize;
        let n = per_sm * self.device.info().sm_count.max(1) as usize;
        resident.insert(key, n);
        Ok(n)
    }

    fn lookup(&self, module: &'static str, name: &'static str) -> Result<Kernel> {
        Ok(self.module(module_of(module, name))?.kernel(name)?)
    }

    /// Module `i` of MODULES, loaded on first use.
    fn module(&self, i: usize) -> Result<&Module> {
        if let Some(m) = self.modules[i].get() {
            return Ok(m);
        }
        let loaded = self
            .device
            .load_module(MODULES[i].name, &MODULES[i].text()?)?;
        // Another thread may have won the race; either module is fine.
        let _ = self.modules[i].set(loaded);
        Ok(self.modules[i].get().expect("just set"))
    }

    /// Load every module now (the driver JIT-compiles the PTX for this GPU on
    /// first load; doing it up front keeps that out of the first request).
    pub fn load_all(&self) -> Result<()> {
        let all: Vec<&'static str> = MODULES.iter().map(|m| m.name).collect();
        self.load_modules(&all, None, &mut |_| {})
    }

    /// Load `modules` (names of [`MODULES`]: a split source's parts by
    /// their own names, `gemm.q4_1`) now, several at once: on a GPU
    /// or driver the PTX has not met before, the driver JIT-compiles each
    /// module on its first load (then keeps the result in its cache,
    /// `~/.nv/ComputeCache`), which takes seconds a module. `threads` caps
    /// the loads at once (1: one after another; default: one a core).
    /// `progress` is called on this thread after each module and every half
    /// second.
    pub fn load_modules(
        &self,
        modules: &[&'static str],
        threads: Option<usize>,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<()> {
        let index: Vec<usize> = modules
            .iter()
            .map(|m| {
                MODULES
                    .iter()
                    .position(|x| x.name == *m)
                    .expect("callers name modules that exist")
            })
            .collect();
        let total = index.len();
        let threads = threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(4, |n| n.get()))
            .min(total)
            .max(1);
        let next = std::sync::atomic::AtomicUsize::new(0);
        let start = std::time::Instant::now();
        let (tx, rx) = std::sync::mpsc::channel::<Result<()>>();
        std::thread::scope(|s| {
            for _ in 0..threads {
                let tx = tx.clone();
                let (next, index) = (&next, &index);
                s.spawn(move || loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= index.len() {
                        break;
                    }
                    let t = std::time::Instant::now();
                    let r = self.module(index[i]).map(|_| ());
                    tracing::debug!(
                        "module {} loaded in {:.2} s",
                        MODULES[index[i]].name,
                        t.elapsed().as_secs_f64()
                    );
                    if tx.send(r).is_err() {
                        break;
                    }
                });
            }
            drop(tx);
            let (mut done, mut failed) = (0, None);
            loop {
                use std::sync::mpsc::RecvTimeoutError;
                match rx.recv_timeout(std::time::Duration::from_millis(500)) {
                    Ok(r) => {
                        done += 1;
                        if let Err(e) = r {
                            failed.get_or_insert(e);
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => break,
                }
                progress(LoadProgress {
                    done,
                    total,
                    elapsed: start.elapsed(),
                });
            }
            failed.map_or(Ok(()), Err)
        })
    }
}

/// How far [`Kernels::load_modules`] has come.
#[derive(Clone, Copy, Debug)]
pub struct LoadProgress {
    /// Modules loaded, of `total`.
    pub done: usize,
    pub total: usize,
    pub elapsed: std::time::Duration,
}

/// The index in [`MODULES`] of the module that holds kernel `name` of the
/// source `module`: the module itself, or, for a source compiled in parts,
/// the part whose PTX defines the kernel.
fn module_of(module: &str, name: &str) -> usize {
    if let Some(i) = MODULES.iter().position(|m| m.name == module) {
        return i;
    }
    let part = INDEX
        .lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(m, entries)| {
            m.strip_prefix(module)
                .is_some_and(|rest| rest.starts_with('.'))
                && entries.split(' ').any(|e| e == name)
        })
        .unwrap_or_else(|| panic!("no module of {module} holds kernel {name}"));
    MODULES
        .iter()
        .position(|m| m.name == part.0)
        .expect("the index names modules that exist")
}

/// The modules of `source` (a `kernels/*.cu` stem) a model whose matrices
/// are in `formats` (kernel symbols, `q4_1`) needs: the source itself, or
/// its common part and the parts of those formats that exist.
pub fn modules_for(source: &str, formats: &[&str]) -> Vec<&'static str> {
    if let Some(m) = MODULES.iter().find(|m| m.name == source) {
        return vec![m.name];
    }
    MODULES
        .iter()
        .map(|m| m.name)
        .filter(|m| {
            m.strip_prefix(source)
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|part| part == "common" || formats.contains(&part))
        })
        .collect()
}

/// The text after `#define NAME ` in a kernel source (tests check the
/// launchers' mirrors of the kernels' constants with it).
#[cfg(test)]
pub(crate) fn cuda_define<'a>(src: &'a str, name: &str) -> Option<&'a str> {
    let at = src.find(&format!("#define {name} "))? + name.len() + 9;
    src[at..].lines().next().map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every source's modules are in MODULES: a plain source as itself, a
    /// split one as each part its `// m40-parts:` line names, nothing else.
    #[test]
    fn modules_mirror_the_kernel_sources() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
        let mut want = Vec::new();
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.extension().is_none_or(|x| x != "cu") {
                continue;
            }
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            let code = std::fs::read_to_string(&p).unwrap();
            match code
                .lines()
                .next()
                .and_then(|l| l.strip_prefix("// m40-parts:"))
            {
                Some(parts) => want.extend(parts.split_whitespace().map(|x| format!("{stem}.{x}"))),
                None => want.push(stem),
            }
        }
        want.sort();
        let mut have: Vec<String> = MODULES.iter().map(|m| m.name.to_string()).collect();
        have.sort();
        assert_eq!(have, want);
    }

    /// Every module decompresses, and the index lists exactly the kernels
    /// its PTX defines, in the same order.
    #[test]
    fn the_index_matches_the_decompressed_ptx() {
        let lines: Vec<&str> = INDEX.lines().collect();
        assert_eq!(lines.len(), MODULES.len());
        for m in MODULES {
            let text = m.text().unwrap();
            assert!(text.starts_with("//"), "{}: not PTX text", m.name);
            let entries: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix(".visible .entry "))
                .map(|e| e.trim_end_matches('('))
                .collect();
            let line = lines
                .iter()
                .find(|l| l.split(' ').next() == Some(m.name))
                .unwrap_or_else(|| panic!("{} is not in the index", m.name));
            let listed: Vec<&str> = line.split(' ').skip(1).collect();
            assert_eq!(listed, entries, "{}", m.name);
        }
    }

    /// Every kernel a launcher names is in the committed PTX.
    #[test]
    fn kernel_names_exist_in_ptx() {
        let has = |n: &str| INDEX.lines().any(|l| l.split(' ').skip(1).any(|e| e == n));
        for f in KernelFormat::ALL {
            assert!(has(f.gemv), "{}", f.gemv);
            assert!(has(f.embed), "{}", f.embed);
            for n in crate::gemm::gemm_names(&f)
                .into_iter()
                .filter(|n| !n.is_empty())
            {
                assert!(has(n), "{n}");
            }
        }
        for f in PackFormat::ALL {
            for n in [
                f.gemv,
                f.gemv_id,
                f.gemm,
                f.gemm_small,
                f.gemm_narrow,
                f.gemm_rows,
                f.embed,
            ]
            .iter()
            .chain(&f.gemv_batch)
            .chain(&[f.gemv_take, f.gemv_emit, f.gemv_chunked])
            {
                assert!(has(n), "{n}");
            }
        }
        for n in [
            "read_probe",
            "fill_random",
            "fma_probe",
            "rmsnorm_f32",
            "rmsnorm_inplace_f32",
            "layernorm_f32",
            "add_layernorm_f32",
            "add_post_rmsnorm_f32",
            "add_post_layernorm_f32",
            "layernorm_inplace_f32",
            "rope_kv_norm_f32",
            "rope_kv_neox_f32",
            "swiglu_f32",
            "glu_pairs_f32",
            "add_f32",
            "add_rows_f32",
            "f32_to_f16",
            "select_top_k_rows_f32",
            "moe_gather_f32",
            "attn_combine_f32",
            "attn_f32_r4",
            "gemm_q4_k_f32",
        ] {
            assert!(has(n), "{n}");
        }
    }

    /// The crate mirrors `kernels/`: every `kernels/X.cu` has its launchers
    /// in `src/X.rs` and its GPU tests in `tests/gpu_kernels/X.rs`, and no
    /// launcher or test module is left without its kernel source.
    #[test]
    fn launchers_and_tests_mirror_the_kernel_sources() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let stems = |dir: &std::path::Path, ext: &str| -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == ext))
                .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        let kernels = stems(&root.join("../../kernels"), "cu");
        // Modules that are not a kernel's: the shared ones, and the test
        // binary's root.
        let shared = ["error", "format", "launch", "layout", "lib", "pack", "main"];
        let own = |dir: &str| -> Vec<String> {
            stems(&root.join(dir), "rs")
                .into_iter()
                .filter(|m| !shared.contains(&m.as_str()))
                .collect()
        };
        assert_eq!(own("src"), kernels, "src/ against kernels/*.cu");
        assert_eq!(
            own("tests/gpu_kernels"),
            kernels,
            "tests/gpu_kernels/ against kernels/*.cu"
        );
    }

    #[test]
    fn kernels_are_found_in_their_part() {
        let name = |i: usize| MODULES[i].name;
        assert_eq!(name(module_of("gemm", "gemm_packed_q4_1_f32")), "gemm.q4_1");
        assert_eq!(name(module_of("gemm", "gemm_small_q6_k_f32")), "gemm.q6_k");
        assert_eq!(name(module_of("gemm", "gemm_reduce_f32")), "gemm.common");
        assert_eq!(
            name(module_of("gemv_packed", "gemv_packed_q8_0_f32_x4")),
            "gemv_packed.q8_0"
        );
        assert_eq!(name(module_of("gemv", "gemv_iq4_xs_f32")), "gemv.iq4_xs");
        assert_eq!(name(module_of("rope", "rope_kv_norm_f32")), "rope");
        assert_eq!(
            modules_for("gemm", &["q4_1", "q8_0"]),
            ["gemm.common", "gemm.q8_0", "gemm.q4_1"]
        );
        assert_eq!(modules_for("gemv_packed", &["q5_0"]), Vec::<&str>::new());
        assert_eq!(modules_for("attention", &["q4_1"]), ["attention"]);
    }
}
