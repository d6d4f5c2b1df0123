//! PTX modules and the kernels in them.

use std::sync::Arc;

use cudarc::driver::{sys, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use crate::device::Device;
use crate::error::{DeviceError, Result};

/// A PTX module loaded into a device's context (the driver JIT-compiles the
/// compute_52 PTX for the GPU at hand here, once).
pub struct Module {
    name: &'static str,
    inner: Arc<CudaModule>,
}

/// One `extern "C" __global__` function of a module.
#[derive(Clone)]
pub struct Kernel {
    pub(crate) func: CudaFunction,
    pub(crate) name: &'static str,
}

/// The compiler's resource use for a kernel on this GPU.
#[derive(Clone, Copy, Debug)]
pub struct KernelAttributes {
    pub registers: i32,
    pub static_shared_bytes: i32,
    pub local_bytes: i32,
    pub max_threads_per_block: i32,
}

impl Device {
    /// Load PTX text (a module of m40-kernels' embedded PTX). `name` names it in errors.
    pub fn load_module(self: &Arc<Self>, name: &'static str, ptx: &str) -> Result<Module> {
        let inner =
            self.ctx
                .load_module(Ptx::from_src(ptx))
                .map_err(|source| DeviceError::ModuleLoad {
                    module: name,
                    source,
                })?;
        Ok(Module { name, inner })
    }
}

impl Module {
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The kernel called `kernel` (its `extern "C"` name).
    pub fn kernel(&self, kernel: &'static str) -> Result<Kernel> {
        let func =
            self.inner
                .load_function(kernel)
                .map_err(|source| DeviceError::MissingKernel {
                    module: self.name,
                    kernel,
                    source,
                })?;
        Ok(Kernel { func, name: kernel })
    }
}

impl Kernel {
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// How many blocks of `block_threads` threads (no dynamic shared memory)
    /// one SM holds at once, by the driver's occupancy calculator.
    pub fn max_active_blocks_per_sm(&self, block_threads: u32) -> Result<u32> {
        self.max_active_blocks_per_sm_with(block_threads, 0)
    }

    /// [`Self::max_active_blocks_per_sm`] with `shared_bytes` of dynamic
    /// shared memory per block.
    pub fn max_active_blocks_per_sm_with(
        &self,
        block_threads: u32,
        shared_bytes: u32,
    ) -> Result<u32> {
        self.func
            .occupancy_max_active_blocks_per_multiprocessor(
                block_threads,
                shared_bytes as usize,
                None,
            )
            .map_err(|source| DeviceError::Driver {
                op: "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                source,
            })
    }

    /// Registers, shared and local memory as the JIT compiled it for this GPU.
    pub fn attributes(&self) -> Result<KernelAttributes> {
        use sys::CUfunction_attribute_enum as A;
        let get = |a| {
            self.func
                .get_attribute(a)
                .map_err(|source| DeviceError::Driver {
                    op: "cuFuncGetAttribute",
                    source,
                })
        };
        Ok(KernelAttributes {
            registers: get(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            static_shared_bytes: get(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            local_bytes: get(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            max_threads_per_block: get(A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        })
    }
}
