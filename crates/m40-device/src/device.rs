//! Opening a GPU: driver checks, the device's properties, the memory budget.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cudarc::driver::sys::{self, CUdevice_attribute as Attr};
use cudarc::driver::{result, CudaContext};

use crate::error::{Ctx, DeviceError, Result, MIN_DRIVER_VERSION};

/// What a GPU is and has, read once when it is opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// (major, minor): (5, 2) for the Tesla M40.
    pub compute_capability: (i32, i32),
    pub total_memory: usize,
    pub sm_count: u32,
    /// `cuDriverGetVersion`: 1000 * major + 10 * minor of the CUDA API the driver provides.
    pub driver_version: i32,
    /// Shared memory a block may use without opting in (48 KB on every GPU since sm_20).
    pub max_shared_per_block: usize,
    pub l2_bytes: usize,
    /// The SMs' peak clock, kHz (`CU_DEVICE_ATTRIBUTE_CLOCK_RATE`).
    pub clock_khz: u32,
}

impl DeviceInfo {
    /// FP32 lanes an SM: 64 on sm_60, sm_70-sm_75 and sm_80, 128 on every
    /// other architecture since Maxwell.
    pub fn fp32_lanes_per_sm(&self) -> u32 {
        match self.compute_capability {
            (6, 0) | (7, _) | (8, 0) => 64,
            _ => 128,
        }
    }

    /// The FP32 FMA rate at the peak clock, FLOP/s (an FMA is two): 6.8
    /// TFLOP/s for the Tesla M40 (24 SMs at 1114 MHz), ~67 for an H100 SXM.
    pub fn peak_fp32_flops(&self) -> f64 {
        2.0 * self.fp32_lanes_per_sm() as f64 * self.sm_count as f64 * self.clock_khz as f64 * 1e3
    }
}

/// How much of the GPU's memory this process may take, and how launches
/// are ordered across streams.
#[derive(Clone, Copy, Debug)]
pub struct DeviceOptions {
    /// Share of the memory free when the device is opened that allocations may
    /// use in total; what the driver, the kernels' code and other processes need
    /// lives in the rest.
    pub memory_share: f64,
    /// cudarc's cross-stream tracking: every launch records an event per
    /// buffer argument and waits on the events of other streams. Off by
    /// default: it costs several microseconds per launch (a decode step
    /// is hundreds of launches), and m40-llm orders streams explicitly
    /// (work and the buffers it uses stay on one stream, or
    /// [`crate::Stream::wait`] on an [`crate::Event`]; a buffer used on a
    /// stream other than its own must outlive that stream's work).
    pub event_tracking: bool,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        Self {
            memory_share: 0.92,
            event_tracking: false,
        }
    }
}

/// Bytes allocated through this crate, against a fixed limit.
#[derive(Debug)]
pub(crate) struct Budget {
    pub(crate) limit: usize,
    pub(crate) used: AtomicUsize,
}

/// An open GPU. Cheap to share (`Arc<Device>`); buffers, streams and modules
/// keep it alive.
pub struct Device {
    pub(crate) ctx: Arc<CudaContext>,
    info: DeviceInfo,
    pub(crate) budget: Arc<Budget>,
    /// The GPU's capture lock, shared by every `Device` opened on it.
    quiet: Arc<Mutex<()>>,
}

thread_local! {
    /// Whether this thread is capturing a graph (a synchronize would break it).
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
}

/// One lock a GPU for whatever must not overlap a graph capture on it.
/// Every `Device` opened on an ordinal shares the driver's primary context,
/// and a context-wide synchronize from any thread while one of its streams
/// captures invalidates that capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED):
/// two engines on one GPU (replicas, stages) would break each other's graphs.
fn capture_lock(ordinal: usize) -> Arc<Mutex<()>> {
    static LOCKS: OnceLock<Mutex<Vec<Arc<Mutex<()>>>>> = OnceLock::new();
    let mut locks = LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    while locks.len() <= ordinal {
        locks.push(Arc::default());
    }
    locks[ordinal].clone()
}

/// Held while a stream of the device captures: no synchronize of the whole
/// context runs meanwhile, from any thread.
pub(crate) struct CaptureGuard<'a> {
    _lock: MutexGuard<'a, ()>,
}

impl Drop for CaptureGuard<'_> {
    fn drop(&mut self) {
        CAPTURING.with(|c| c.set(false));
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("info", &self.info).finish()
    }
}

/// Load the driver library and initialize it, or say why that cannot be done.
fn init_driver() -> Result<i32> {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { sys::is_culib_present() } {
        return Err(DeviceError::NoDriver);
    }
    result::init().map_err(|e| match e.0 {
        sys::cudaError_enum::CUDA_ERROR_NO_DEVICE => DeviceError::NoDevice(String::new()),
        // The toolkit's stub libcuda, not a driver.
        sys::cudaError_enum::CUDA_ERROR_STUB_LIBRARY => DeviceError::NoDriver,
        _ => DeviceError::Driver {
            op: "cuInit",
            source: e,
        },
    })?;
    let mut version = 0;
    // SAFETY: the library is loaded and initialized; `version` outlives the call.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .ctx("cuDriverGetVersion")?;
    Ok(version)
}

impl Device {
    /// Number of GPUs the driver sees. Errors (rather than 0) when there is no
    /// driver, so callers can tell the user why.
    pub fn count() -> Result<usize> {
        init_driver()?;
        let n = result::device::get_count().ctx("cuDeviceGetCount")?;
        Ok(n.max(0) as usize)
    }

    /// Open GPU `ordinal` with the default options.
    pub fn open(ordinal: usize) -> Result<Arc<Device>> {
        Self::open_with(ordinal, DeviceOptions::default())
    }

    /// Open GPU `ordinal`: checks the driver version (our PTX needs R520+) and
    /// the compute capability (5.2+), creates the context and fixes the memory
    /// budget at `options.memory_share` of the memory free now.
    pub fn open_with(ordinal: usize, options: DeviceOptions) -> Result<Arc<Device>> {
        let driver_version = init_driver()?;
        if driver_version < MIN_DRIVER_VERSION {
            return Err(DeviceError::DriverTooOld {
                found: driver_version,
            });
        }
        let count = result::device::get_count().ctx("cuDeviceGetCount")?.max(0) as usize;
        if count == 0 {
            return Err(DeviceError::NoDevice(String::new()));
        }
        if ordinal >= count {
            return Err(DeviceError::BadOrdinal { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).ctx("creating the CUDA context")?;
        if !options.event_tracking {
            // SAFETY: nothing has run in this context yet; from here on the
            // ordering rules of DeviceOptions::event_tracking apply.
            unsafe { ctx.disable_event_tracking() };
        }
        let attr = |a: Attr| ctx.attribute(a).ctx("cuDeviceGetAttribute");
        let name = ctx.name().ctx("cuDeviceGetName")?;
        let (major, minor) = ctx.compute_capability().ctx("compute capability")?;
        if (major, minor) < (5, 2) {
            return Err(DeviceError::ComputeCapability {
                ordinal,
                name,
                major,
                minor,
            });
        }
        let info = DeviceInfo {
            ordinal,
            name,
            compute_capability: (major, minor),
            total_memory: ctx.total_mem().ctx("cuDeviceTotalMem")?,
            sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            driver_version,
            max_shared_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?
                as usize,
            l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize,
            clock_khz: attr(Attr::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)? as u32,
        };
        let (free, _) = ctx.mem_get_info().ctx("cuMemGetInfo")?;
        let share = options.memory_share.clamp(0.0, 1.0);
        let budget = Arc::new(Budget {
            limit: (free as f64 * share) as usize,
            used: AtomicUsize::new(0),
        });
        Ok(Arc::new(Device {
            ctx,
            info,
            budget,
            quiet: capture_lock(ordinal),
        }))
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// (free, total) bytes on the GPU now, as the driver reports them.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().ctx("cuMemGetInfo")
    }

    /// Bytes this process may still allocate through this device.
    pub fn budget_left(&self) -> usize {
        self.budget
            .limit
            .saturating_sub(self.budget.used.load(Ordering::Relaxed))
    }

    /// Bytes allocated through this device and not yet freed.
    pub fn budget_used(&self) -> usize {
        self.budget.used.load(Ordering::Relaxed)
    }

    pub fn budget_limit(&self) -> usize {
        self.budget.limit
    }

    /// Wait until all work on every stream of this device is done. Waits
    /// first for a graph capture on this GPU by another thread to end; from
    /// inside a capture it is an error.
    pub fn synchronize(&self) -> Result<()> {
        if CAPTURING.with(Cell::get) {
            return Err(DeviceError::Capture(
                "a synchronize of the device inside a graph capture",
            ));
        }
        let _quiet = self.quiet.lock().unwrap_or_else(|p| p.into_inner());
        self.ctx.synchronize().ctx("cuCtxSynchronize")
    }

    /// Synchronize, then hold the GPU's capture lock until the guard drops:
    /// the start of a capture. Errors inside another capture on this thread.
    pub(crate) fn begin_capture(&self) -> Result<CaptureGuard<'_>> {
        if CAPTURING.with(Cell::get) {
            return Err(DeviceError::Capture("a graph capture inside another"));
        }
        let lock = self.quiet.lock().unwrap_or_else(|p| p.into_inner());
        self.ctx.synchronize().ctx("cuCtxSynchronize")?;
        CAPTURING.with(|c| c.set(true));
        Ok(CaptureGuard { _lock: lock })
    }

    /// Take `bytes` from the budget; false if they do not fit.
    pub(crate) fn reserve(&self, bytes: usize) -> bool {
        let b = &self.budget;
        let mut used = b.used.load(Ordering::Relaxed);
        loop {
            if used.checked_add(bytes).is_none_or(|u| u > b.limit) {
                return false;
            }
            match b
                .used
                .compare_exchange(used, used + bytes, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => used = now,
            }
        }
    }

    pub(crate) fn oom(&self, what: &str, bytes: usize) -> DeviceError {
        DeviceError::OutOfMemory {
            what: what.to_string(),
            requested: bytes,
            used: self.budget_used(),
            limit: self.budget.limit,
            free: self.memory().map(|m| m.0).unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(cc: (i32, i32), sms: u32, mhz: u32) -> DeviceInfo {
        DeviceInfo {
            ordinal: 0,
            name: String::new(),
            compute_capability: cc,
            total_memory: 0,
            sm_count: sms,
            driver_version: 0,
            max_shared_per_block: 48 << 10,
            l2_bytes: 0,
            clock_khz: mhz * 1000,
        }
    }

    #[test]
    fn the_fp32_peak_counts_each_architectures_lanes() {
        // The Tesla M40 (its datasheet: 6.8 TFLOP/s), a P100 (64 lanes an
        // SM: 10.6 at 1480 MHz), an H100 SXM (~67).
        let tf = |i: DeviceInfo| (i.peak_fp32_flops() / 1e11).round() / 10.0;
        assert_eq!(tf(info((5, 2), 24, 1114)), 6.8);
        assert_eq!(tf(info((6, 0), 56, 1480)), 10.6);
        assert_eq!(tf(info((9, 0), 132, 1980)), 66.9);
    }
}
