//! What every launcher shares: the shape errors, the checks of lengths and
//! of i32 ranges, and launch configurations.

use m40_device::LaunchConfig;

use crate::error::{KernelError, Result};
use crate::{Kernels, MAX_SHARED_PER_BLOCK};

pub(crate) fn shape(kernel: &'static str, what: String) -> KernelError {
    KernelError::Shape { kernel, what }
}

/// `buf` must hold at least `need` elements.
pub(crate) fn check_len(kernel: &'static str, name: &str, len: usize, need: usize) -> Result<()> {
    if len < need {
        return Err(shape(
            kernel,
            format!("{name} has {len} elements, {need} needed"),
        ));
    }
    Ok(())
}

pub(crate) fn to_i32(kernel: &'static str, name: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| shape(kernel, format!("{name} = {v} exceeds i32")))
}

pub(crate) fn cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid,
        block: (block, 1, 1),
        shared_bytes: 0,
    }
}

/// [`cfg`] with `shared_bytes` of dynamic shared memory a block.
pub(crate) fn cfg_shared(grid: (u32, u32, u32), block: u32, shared_bytes: u32) -> LaunchConfig {
    LaunchConfig {
        shared_bytes,
        ..cfg(grid, block)
    }
}

impl Kernels {
    /// `bytes` of shared memory a block of `kernel` needs must fit this
    /// device's limit (and sm_52's 48 KB).
    pub(crate) fn check_shared(&self, kernel: &'static str, bytes: usize) -> Result<()> {
        let limit = MAX_SHARED_PER_BLOCK.min(self.device().info().max_shared_per_block);
        if bytes > limit {
            return Err(KernelError::SharedMemory {
                kernel,
                bytes,
                limit,
            });
        }
        Ok(())
    }
}
