use m40_gguf::GgufError;

/// Errors from loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("tensor `{name}` is {ty}, which m40-llm cannot compute with yet (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS, MXFP4)")]
    UnsupportedWeight {
        name: String,
        ty: m40_gguf::GgmlType,
    },
    #[error("{needed} tokens do not fit the context of {n_ctx} ({used} already used)")]
    ContextFull {
        needed: usize,
        used: usize,
        n_ctx: usize,
    },
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken { id: u32, n_vocab: usize },
    #[error("the model needs {need} of GPU memory on {device}, which has {free}; {hint}")]
    GpuMemory {
        device: String,
        need: String,
        free: String,
        hint: String,
    },
    #[error("the model does not fit this machine's GPUs and memory together: it needs {need}, and they have {have}; {hint}")]
    Placement {
        need: String,
        have: String,
        hint: String,
    },
    #[error("{what} needs {need} of memory and this machine has {available} available; {hint}")]
    HostMemory {
        what: String,
        need: String,
        available: String,
        hint: String,
    },
    #[error("the KV cache is full: {needed} more tokens needed, {free} of {total} free (other sequences hold the rest)")]
    KvFull {
        needed: usize,
        free: usize,
        total: usize,
    },
    #[error(transparent)]
    Device(#[from] m40_device::DeviceError),
    #[error(transparent)]
    Kernel(#[from] m40_kernels::KernelError),
    #[error("unsupported model: {0}")]
    Unsupported(String),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
