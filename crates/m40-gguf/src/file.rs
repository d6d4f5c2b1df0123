//! Opening GGUF files: a memory map, the header and metadata decoded by a
//! bounds-checked walk (crate::header), and zero-copy tensor views.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{GgufError, Result};
use crate::header::read_header;
use crate::metadata::Metadata;
use crate::types::GgmlType;

/// Where a tensor's bytes live and how to read them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// GGUF order: the fastest-varying dimension (the row length) first.
    pub shape: Vec<u64>,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Data size in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Elements per row (`shape[0]`).
    pub fn row_len(&self) -> usize {
        self.shape[0] as usize
    }

    /// Number of rows (the product of the other dimensions).
    pub fn n_rows(&self) -> usize {
        (self.n_elements() / self.shape[0]) as usize
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        (self.n_bytes / self.n_rows() as u64) as usize
    }

    /// Matrices of a 3-D tensor (a mixture's experts): `shape[2]`, else 1.
    pub fn n_matrices(&self) -> usize {
        self.shape.get(2).map_or(1, |&n| n as usize)
    }

    /// The info of matrix `i` of a 3-D tensor (expert `i`): `shape[1]` rows
    /// of `shape[0]`, its bytes the i-th slab (see [`TensorView::matrix`]).
    pub fn matrix(&self, i: usize) -> TensorInfo {
        let per = self.n_bytes / self.n_matrices() as u64;
        TensorInfo {
            name: format!("{}[{i}]", self.name),
            ty: self.ty,
            shape: self.shape[..2.min(self.shape.len())].to_vec(),
            offset: self.offset + i as u64 * per,
            n_bytes: per,
        }
    }
}

/// A tensor's descriptor and its bytes, borrowed from the file's map.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub info: &'a TensorInfo,
    pub data: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// Matrix `i` of a 3-D tensor (expert `i`), under `info` =
    /// `self.info.matrix(i)`.
    pub fn matrix(&self, info: &'a TensorInfo, i: usize) -> TensorView<'a> {
        let per = info.n_bytes as usize;
        TensorView {
            info,
            data: &self.data[i * per..(i + 1) * per],
        }
    }

    /// The bytes of row `i`.
    pub fn row(&self, i: usize) -> &'a [u8] {
        let rb = self.info.row_bytes();
        &self.data[i * rb..(i + 1) * rb]
    }

    /// Dequantize the whole tensor to `f32` (for tests and tools: the engine
    /// works on rows).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.info.n_elements() as usize];
        crate::quant::dequantize(self.info.ty, self.data, &mut out)?;
        Ok(out)
    }
}

enum Bytes {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Map(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// An open GGUF file (version 2 or 3).
pub struct GgufFile {
    path: PathBuf,
    bytes: Bytes,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-map and parse `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process; like every
        // GGUF reader we assume the file is not truncated while it is mapped.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(path.to_path_buf(), Bytes::Map(map))
    }

    /// Parse a GGUF image held in memory (tests, fuzzing, generated files).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::parse(PathBuf::from("<memory>"), Bytes::Owned(bytes))
    }

    fn parse(path: PathBuf, bytes: Bytes) -> Result<Self> {
        let h = read_header(bytes.as_slice())?;
        let mut tensors = Vec::with_capacity(h.tensors.len());
        let mut index = HashMap::with_capacity(h.tensors.len());
        for t in h.tensors {
            let offset = h.data_offset + t.offset;
            // read_header checked the data against the end of the file from
            // the data section's start.
            debug_assert!(offset + t.n_bytes <= bytes.as_slice().len() as u64);
            index.insert(t.name.clone(), tensors.len());
            tensors.push(TensorInfo {
                name: t.name,
                ty: t.ty,
                shape: t.shape,
                offset,
                n_bytes: t.n_bytes,
            });
        }
        Ok(Self {
            path,
            bytes,
            version: h.version,
            metadata: h.metadata,
            tensors,
            index,
            alignment: h.alignment,
            data_offset: h.data_offset,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Tensor descriptors in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// Replace the 2-D tensor `name` by consecutive row ranges of it, each
    /// a tensor of its own (`parts`: name and rows, in order, covering all
    /// its rows; a part may take the whole tensor's name): phi3's fused
    /// Q/K/V and gate/up, seen as the matrices the forward pass reads. The
    /// bytes are the file's, not copied.
    pub fn split_rows(&mut self, name: &str, parts: &[(String, usize)]) -> Result<()> {
        let bad = |what: String| GgufError::BadTensor {
            name: name.to_string(),
            what,
        };
        let Some(&i) = self.index.get(name) else {
            return Err(bad("missing".into()));
        };
        let info = self.tensors[i].clone();
        let rows: usize = parts.iter().map(|p| p.1).sum();
        if info.shape.len() != 2 || rows != info.n_rows() {
            return Err(bad(format!(
                "shape {:?} cannot be split into rows {:?}",
                info.shape,
                parts.iter().map(|p| p.1).collect::<Vec<_>>()
            )));
        }
        if let Some((part, _)) = parts
            .iter()
            .find(|(p, _)| p != name && self.index.contains_key(p))
        {
            return Err(bad(format!("part `{part}` names an existing tensor")));
        }
        let rb = info.row_bytes() as u64;
        self.index.remove(name);
        let mut first = 0u64;
        for (k, (part, n)) in parts.iter().enumerate() {
            let t = TensorInfo {
                name: part.clone(),
                ty: info.ty,
                shape: vec![info.shape[0], *n as u64],
                offset: info.offset + first * rb,
                n_bytes: *n as u64 * rb,
            };
            first += *n as u64;
            // The first part reuses the tensor's slot, the rest are added.
            let slot = if k == 0 {
                self.tensors[i] = t;
                i
            } else {
                self.tensors.push(t);
                self.tensors.len() - 1
            };
            self.index.insert(part.clone(), slot);
        }
        Ok(())
    }

    /// A zero-copy view of a tensor's data.
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.tensor_info(name).map(|info| self.view(info))
    }

    /// The view for a descriptor of this file.
    pub fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        let start = info.offset as usize;
        TensorView {
            info,
            data: &self.bytes.as_slice()[start..start + info.n_bytes as usize],
        }
    }

    /// Tensor data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// File size in bytes.
    pub fn file_size(&self) -> u64 {
        self.bytes.as_slice().len() as u64
    }

    /// Total number of weights in all tensors.
    pub fn n_params(&self) -> u64 {
        self.tensors.iter().map(TensorInfo::n_elements).sum()
    }

    /// `general.architecture`, if present.
    pub fn architecture(&self) -> Result<&str> {
        self.metadata.str("general.architecture")
    }
}
