//! m40-gguf: GGUF files for m40-llm.
//!
//! - [`GgufFile`] opens GGUF v2/v3 with a memory map; metadata and tensor
//!   descriptors are decoded by a bounds-checked walk
//!   ([`header`](crate::header)) that names the offset and key of any
//!   problem and, like llama.cpp, takes any UTF-8 key; tensor data is served
//!   as zero-copy [`TensorView`]s. gguf-rs-lib writes files ([`GgufWriter`]).
//! - [`Metadata`] gives typed access with errors that name the key.
//! - [`HyperParams`] reads the llama family's shape and checks its tensors.
//! - [`quant`] holds the GGML block formats and CPU (de)quantization.
//! - [`GgufWriter`] and [`synth`] write files, streaming tensor by tensor.
//!
//! This crate knows nothing about CUDA.

pub mod error;
mod file;
pub mod fused;
mod header;
pub mod hparams;
pub mod metadata;
pub mod quant;
pub mod rope;
pub mod shapes;
pub mod synth;
pub mod types;
pub mod writer;

pub use error::{GgufError, Result};
pub use file::{GgufFile, TensorInfo, TensorView};
pub use hparams::{Arch, HyperParams, NormKind, RopeScaling, RopeStyle};
pub use metadata::{Array, Metadata, Value};
pub use types::GgmlType;
pub use writer::{GgufWriter, TensorSpec};
