use m40_device::DeviceError;
use m40_gguf::GgmlType;

/// Errors of the launchers: a precondition the kernel relies on does not
/// hold, or the device failed.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("{kernel}: {what}")]
    Shape { kernel: &'static str, what: String },
    #[error("{kernel}: no GPU kernel for {ty} weights (supported: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4)")]
    Unsupported { kernel: &'static str, ty: GgmlType },
    #[error("{kernel}: needs {bytes} bytes of shared memory per block; the limit is {limit}")]
    SharedMemory {
        kernel: &'static str,
        bytes: usize,
        limit: usize,
    },
    #[error(transparent)]
    Device(#[from] DeviceError),
}

pub type Result<T, E = KernelError> = std::result::Result<T, E>;
