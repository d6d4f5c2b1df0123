use cudarc::driver::sys::cudaError_enum as Cu;
use cudarc::driver::DriverError;

/// The oldest driver API version (`cuDriverGetVersion`) that accepts our PTX:
/// NVRTC 11.8 emits PTX ISA 7.8, which drivers from R520 (CUDA 11.8) on load.
pub const MIN_DRIVER_VERSION: i32 = 11080;

/// Errors of the device layer. Variants where the user can fix the cause carry
/// the fix in their message.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("no CUDA driver found (libcuda could not be loaded): install the NVIDIA driver (R520 or later)")]
    NoDriver,
    #[error("the CUDA driver found no GPU{0}")]
    NoDevice(String),
    #[error("GPU {ordinal} does not exist: {count} GPU(s) found (ordinals 0..{count})")]
    BadOrdinal { ordinal: usize, count: usize },
    #[error(
        "the NVIDIA driver is too old: it provides CUDA {}.{}, the kernels need {}.{} (driver R520 or later); update the driver",
        .found / 1000, (.found % 1000) / 10, MIN_DRIVER_VERSION / 1000, (MIN_DRIVER_VERSION % 1000) / 10
    )]
    DriverTooOld { found: i32 },
    #[error("GPU {ordinal} ({name}) has compute capability {major}.{minor}; m40-llm needs 5.2 (Maxwell GM200, e.g. Tesla M40) or later")]
    ComputeCapability {
        ordinal: usize,
        name: String,
        major: i32,
        minor: i32,
    },
    #[error(
        "out of GPU memory allocating {what}: {requested} bytes requested, {used} of the {limit}-byte budget in use ({free} bytes free on the GPU)"
    )]
    OutOfMemory {
        what: String,
        requested: usize,
        used: usize,
        limit: usize,
        free: usize,
    },
    #[error("loading kernel module {module}: {source}{}", ptx_hint(.source))]
    ModuleLoad {
        module: &'static str,
        source: DriverError,
    },
    #[error("kernel {kernel} is not in module {module}: {source}")]
    MissingKernel {
        module: &'static str,
        kernel: &'static str,
        source: DriverError,
    },
    #[error("graph capture: {0}")]
    Capture(&'static str),
    #[error("launching kernel {kernel}: {source}")]
    Launch {
        kernel: &'static str,
        source: DriverError,
    },
    #[error("{what}: {len} elements where {capacity} were expected")]
    Size {
        what: &'static str,
        len: usize,
        capacity: usize,
    },
    #[error("{op}: {source}")]
    Driver {
        op: &'static str,
        source: DriverError,
    },
}

fn ptx_hint(e: &DriverError) -> &'static str {
    match e.0 {
        Cu::CUDA_ERROR_UNSUPPORTED_PTX_VERSION => {
            " (the driver is older than the PTX; install driver R520 or later)"
        }
        Cu::CUDA_ERROR_NO_BINARY_FOR_GPU | Cu::CUDA_ERROR_INVALID_PTX => {
            " (this GPU cannot run compute_52 PTX; m40-llm needs compute capability 5.2 or later)"
        }
        _ => "",
    }
}

pub type Result<T, E = DeviceError> = std::result::Result<T, E>;

/// Attach the operation's name to a driver error; out-of-memory errors from
/// the driver become [`DeviceError::OutOfMemory`] elsewhere, where the
/// allocation's name is known.
pub(crate) trait Ctx<T> {
    fn ctx(self, op: &'static str) -> Result<T>;
}

impl<T> Ctx<T> for std::result::Result<T, DriverError> {
    fn ctx(self, op: &'static str) -> Result<T> {
        self.map_err(|source| DeviceError::Driver { op, source })
    }
}
