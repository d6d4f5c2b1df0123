//! The CUDA kernels of m40-llm and one launcher per kernel.
//!
//! The PTX in `kernels/ptx/` (compiled from `kernels/*.cu` for compute_52 by
//! `cargo xtask ptx`, committed) is embedded here with `include_str!`; each
//! module is loaded into a device the first time one of its kernels is
//! launched there ([`Kernels`] holds one per device). Every launcher owns its
//! kernel's grid math (block sizes are named constants mirroring the `.cu`
//! file) and checks what the kernel assumes: buffer lengths, alignment, the
//! 48 KB of shared memory a block may have on sm_52. Kernels know nothing of
//! models: shapes come in as numbers.

mod attention;
mod decode;
mod error;
mod format;
mod ops;
mod pack;
mod sample;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use m40_device::{Device, Kernel, Module};

pub use attention::{
    attn_shared_bytes, gemm_k_splits, gemm_large_tiles, gemm_plan, gemm_scratch_len, AttnPlan,
    AttnScratch, AttnShape, GemmPlan, GemmSlots, KV_PAGE, MAX_HEAD_DIM,
};
pub use decode::DecodeProgram;
pub use error::{KernelError, Result};
pub use format::{gemv_chunk_blocks, gemv_shared_bytes, KernelFormat};
pub use ops::{
    Fold, GemvLaunch, GemvOut, GemvPlan, PackedMatrix, QMatrix, RopeKv, RopeParams, RopeStyle,
    RowSplit, PACKED_GEMV_MAX_TOKENS,
};
pub use pack::{interleave_glu, pack_gemv, PackFormat, PACK_ROWS};
pub use sample::{select_args, Penalties, SELECT_ARGS, SELECT_MAX_K, SELECT_SCRATCH};

/// Shared memory a block may use on sm_52 (and without opt-in on any GPU).
pub const MAX_SHARED_PER_BLOCK: usize = 48 * 1024;

/// The PTX modules: (name, text), one per `kernels/*.cu`.
pub const MODULES: [(&str, &str); 11] = [
    (
        "attention",
        include_str!("../../../kernels/ptx/attention.ptx"),
    ),
    ("bench", include_str!("../../../kernels/ptx/bench.ptx")),
    ("decode", include_str!("../../../kernels/ptx/decode.ptx")),
    (
        "elementwise",
        include_str!("../../../kernels/ptx/elementwise.ptx"),
    ),
    ("embed", include_str!("../../../kernels/ptx/embed.ptx")),
    ("gemm", include_str!("../../../kernels/ptx/gemm.ptx")),
    ("gemv", include_str!("../../../kernels/ptx/gemv.ptx")),
    (
        "gemv_packed",
        include_str!("../../../kernels/ptx/gemv_packed.ptx"),
    ),
    ("rmsnorm", include_str!("../../../kernels/ptx/rmsnorm.ptx")),
    ("rope", include_str!("../../../kernels/ptx/rope.ptx")),
    ("sample", include_str!("../../../kernels/ptx/sample.ptx")),
];

/// The kernels of one device; modules load on first use, and each kernel's
/// handle is looked up once (a launch costs no driver lookup).
pub struct Kernels {
    device: Arc<Device>,
    modules: [OnceLock<Module>; MODULES.len()],
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
            modules: Default::default(),
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
        let i = MODULES
            .iter()
            .position(|(m, _)| *m == module)
            .expect("launchers name modules that exist");
        Ok(self.module(i)?.kernel(name)?)
    }

    /// Module `i` of MODULES, loaded on first use.
    fn module(&self, i: usize) -> Result<&Module> {
        if let Some(m) = self.modules[i].get() {
            return Ok(m);
        }
        let loaded = self.device.load_module(MODULES[i].0, MODULES[i].1)?;
        // Another thread may have won the race; either module is fine.
        let _ = self.modules[i].set(loaded);
        Ok(self.modules[i].get().expect("just set"))
    }

    /// Load every module now (the driver JIT-compiles the PTX for this GPU on
    /// first load; doing it up front keeps that out of the first request).
    pub fn load_all(&self) -> Result<()> {
        for i in 0..MODULES.len() {
            self.module(i)?;
        }
        Ok(())
    }
}

/// The text after `#define NAME ` in a kernel source (tests check the
/// launchers' mirrors of the kernels' constants with it).
#[cfg(test)]
pub(crate) fn cuda_define<'a>(src: &'a str, name: &str) -> Option<&'a str> {
    let at = src.find(&format!("#define {name} "))? + name.len() + 9;
    src[at..].lines().next().map(str::trim)
}
