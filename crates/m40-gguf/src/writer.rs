//! Writing GGUF v3 files tensor by tensor, so a model never has to be held
//! in memory whole. gguf-rs-lib encodes the header, the metadata values and
//! the tensor descriptors; the keys are written here, because gguf-rs-lib
//! refuses keys llama.cpp writes (`gpt-oss.context_length`: architecture
//! names with '-').

use std::io::{Read, Write};

use gguf_rs_lib::format::header::{GGUFHeader, TensorInfo as LibTensorInfo};

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
    out: Counted<W>,
    /// Each declared tensor's size in bytes.
    sizes: Vec<u64>,
    next: usize,
}

/// A sink that counts the bytes written, for the alignment padding.
struct Counted<W> {
    inner: W,
    pos: u64,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.pos += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Write> Counted<W> {
    fn pad(&mut self) -> Result<()> {
        let n = self.pos.next_multiple_of(ALIGNMENT) - self.pos;
        self.write_all(&vec![0u8; n as usize]).map_err(io)
    }
}

fn lib_err(e: gguf_rs_lib::error::GGUFError) -> GgufError {
    GgufError::Write(e.to_string())
}

fn io(e: std::io::Error) -> GgufError {
    GgufError::Write(e.to_string())
}

impl<W: Write> GgufWriter<W> {
    pub fn new(out: W, metadata: &Metadata, tensors: &[TensorSpec]) -> Result<Self> {
        let mut out = Counted { inner: out, pos: 0 };
        GGUFHeader::new(tensors.len() as u64, metadata.len() as u64)
            .write_to(&mut out)
            .map_err(lib_err)?;
        for (key, value) in metadata.iter() {
            let v = value.to_lib();
            out.write_all(&(key.len() as u64).to_le_bytes())
                .and_then(|_| out.write_all(key.as_bytes()))
                .and_then(|_| out.write_all(&(v.value_type() as u32).to_le_bytes()))
                .map_err(io)?;
            v.write_to(&mut out).map_err(lib_err)?;
        }
        let mut sizes = Vec::with_capacity(tensors.len());
        let mut offset = 0u64;
        for t in tensors {
            let size = t.n_bytes()?;
            LibTensorInfo::new(t.name.clone(), t.shape.clone(), t.ty as u32, offset)
                .write_to(&mut out)
                .map_err(lib_err)?;
            sizes.push(size);
            offset = (offset + size).next_multiple_of(ALIGNMENT);
        }
        out.pad()?;
        Ok(Self {
            out,
            sizes,
            next: 0,
        })
    }

    /// Write the next tensor's data, read from `data` (exactly its size).
    pub fn write_tensor(&mut self, data: impl Read) -> Result<()> {
        let &size = self
            .sizes
            .get(self.next)
            .ok_or_else(|| GgufError::Write("more tensors written than declared".into()))?;
        let mut data = data.take(size + 1);
        let n = std::io::copy(&mut data, &mut self.out).map_err(io)?;
        if n != size {
            return Err(GgufError::Write(format!(
                "tensor {} has {n} bytes of data, {size} declared",
                self.next
            )));
        }
        self.out.pad()?;
        self.next += 1;
        Ok(())
    }

    /// Flush and return the sink; every declared tensor must have been written.
    pub fn finish(mut self) -> Result<W> {
        if self.next != self.sizes.len() {
            return Err(GgufError::Write(format!(
                "{} of {} tensors written",
                self.next,
                self.sizes.len()
            )));
        }
        self.out.flush().map_err(io)?;
        Ok(self.out.inner)
    }
}
