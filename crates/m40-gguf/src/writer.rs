//! Writing GGUF v3 files tensor by tensor through gguf-rs-lib's stream writer,
//! so a model never has to be held in memory whole.

use std::io::{Read, Write};

use gguf_rs_lib::format::header::GGUFHeader;
use gguf_rs_lib::format::types::GGUFTensorType;
use gguf_rs_lib::tensor::{TensorInfo as LibTensorInfo, TensorShape};
use gguf_rs_lib::writer::{GGUFStreamWriter, StreamWriterConfig};

use crate::error::{GgufError, Result};
use crate::metadata::Metadata;
use crate::types::GgmlType;

/// Tensor data alignment written into every file (GGUF's default).
pub const ALIGNMENT: u64 = 32;

/// A tensor to be written: its name, type and GGUF shape (row length first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub ty: GgmlType,
    pub shape: Vec<u64>,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, ty: GgmlType, shape: &[u64]) -> Self {
        Self {
            name: name.into(),
            ty,
            shape: shape.to_vec(),
        }
    }

    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Size of the data in bytes, or an error when the row length is not whole blocks.
    pub fn n_bytes(&self) -> Result<u64> {
        self.ty
            .row_bytes(self.n_elements())
            .filter(|_| self.shape[0].is_multiple_of(self.ty.block_len() as u64))
            .ok_or(GgufError::BadRowLength {
                ty: self.ty,
                len: self.shape[0] as usize,
                block: self.ty.block_len(),
            })
    }
}

/// Writes header, metadata and descriptors up front; then each tensor's data
/// in declaration order through [`GgufWriter::write_tensor`].
pub struct GgufWriter<W: Write> {
    inner: GGUFStreamWriter<W>,
    infos: Vec<LibTensorInfo>,
    next: usize,
}

fn lib_err(e: gguf_rs_lib::error::GGUFError) -> GgufError {
    GgufError::Write(e.to_string())
}

impl<W: Write> GgufWriter<W> {
    pub fn new(out: W, metadata: &Metadata, tensors: &[TensorSpec]) -> Result<Self> {
        let mut infos = Vec::with_capacity(tensors.len());
        let mut offset = 0u64;
        for t in tensors {
            let size = t.n_bytes()?;
            let ty = GGUFTensorType::from_u32(t.ty as u32).map_err(lib_err)?;
            let shape = TensorShape::new(t.shape.clone()).map_err(lib_err)?;
            infos.push(LibTensorInfo::new(t.name.clone(), shape, ty, offset));
            offset = (offset + size).div_ceil(ALIGNMENT) * ALIGNMENT;
        }
        let config = StreamWriterConfig {
            tensor_alignment: ALIGNMENT as usize,
            validate_data: true,
            buffer_size: 1 << 20,
        };
        let mut inner = GGUFStreamWriter::with_config(out, config);
        inner
            .write_header(&GGUFHeader::new(
                tensors.len() as u64,
                metadata.len() as u64,
            ))
            .map_err(lib_err)?;
        inner.write_metadata(&metadata.to_lib()).map_err(lib_err)?;
        inner.write_tensor_infos(&infos).map_err(lib_err)?;
        inner.align_for_tensor_data().map_err(lib_err)?;
        Ok(Self {
            inner,
            infos,
            next: 0,
        })
    }

    /// Write the next tensor's data, read from `data` (exactly its size).
    pub fn write_tensor(&mut self, data: impl Read) -> Result<()> {
        let info = self
            .infos
            .get(self.next)
            .ok_or_else(|| GgufError::Write("more tensors written than declared".into()))?;
        self.inner
            .write_tensor_data_chunked(info, data)
            .map_err(lib_err)?;
        self.next += 1;
        Ok(())
    }

    /// Flush and return the sink; every declared tensor must have been written.
    pub fn finish(mut self) -> Result<W> {
        if self.next != self.infos.len() {
            return Err(GgufError::Write(format!(
                "{} of {} tensors written",
                self.next,
                self.infos.len()
            )));
        }
        self.inner.finalize().map_err(lib_err)?;
        Ok(self.inner.into_inner())
    }
}
