//! Opening GGUF files: a memory map, the header and metadata decoded through
//! gguf-rs-lib, and zero-copy tensor views.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use gguf_rs_lib::reader::{GGUFFileReader, GGUFReaderConfig};
use memmap2::Mmap;

use crate::error::{GgufError, Result};
use crate::metadata::Metadata;
use crate::prescan::prescan;
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
}

/// A tensor's descriptor and its bytes, borrowed from the file's map.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub info: &'a TensorInfo,
    pub data: &'a [u8],
}

impl<'a> TensorView<'a> {
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

/// Presents a GGUF v2 file to gguf-rs-lib, which accepts only v3, as v3.
/// The two versions have the same layout (v3 added only big-endian files,
/// which m40-llm does not read), so only the version field differs.
struct AsV3<'a> {
    bytes: &'a [u8],
    pos: u64,
}

impl Read for AsV3<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let start = (self.pos as usize).min(self.bytes.len());
        let n = buf.len().min(self.bytes.len() - start);
        buf[..n].copy_from_slice(&self.bytes[start..start + n]);
        let v3 = 3u32.to_le_bytes();
        for (i, b) in buf[..n].iter_mut().enumerate() {
            let at = start + i;
            if (4..8).contains(&at) {
                *b = v3[at - 4];
            }
        }
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for AsV3<'_> {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        let len = self.bytes.len() as i128;
        let new = match pos {
            SeekFrom::Start(p) => p as i128,
            SeekFrom::End(d) => len + d as i128,
            SeekFrom::Current(d) => self.pos as i128 + d as i128,
        };
        if new < 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "seek before start",
            ));
        }
        self.pos = new as u64;
        Ok(self.pos)
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
        let data = bytes.as_slice();
        let scan = prescan(data)?;
        let config = GGUFReaderConfig {
            validate_integrity: true,
            ..Default::default()
        };
        let reader = GGUFFileReader::with_config(
            AsV3 {
                bytes: data,
                pos: 0,
            },
            config,
        )?;
        if reader.tensor_count() as u64 != scan.tensor_count
            || reader.metadata().len() as u64 != scan.kv_count
        {
            return Err(GgufError::Library(
                "decoded counts differ from the header".into(),
            ));
        }
        let metadata = Metadata::from_lib(reader.metadata())?;
        let alignment = reader.tensor_alignment();
        let data_offset = reader.tensor_data_offset();
        debug_assert!(data_offset >= scan.descriptors_end);

        let mut tensors = Vec::with_capacity(reader.tensor_infos().len());
        let mut index = HashMap::with_capacity(tensors.capacity());
        for t in reader.tensor_infos() {
            let name = t.name().to_string();
            let id = t.tensor_type() as u32;
            let ty = GgmlType::from_id(id).ok_or_else(|| GgufError::UnknownType {
                name: name.clone(),
                id,
            })?;
            let shape: Vec<u64> = t.shape().dims().to_vec();
            let bad = |what: String| GgufError::BadTensor {
                name: name.clone(),
                what,
            };
            let n: u64 = shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .ok_or_else(|| bad("element count overflows".into()))?;
            let n_bytes = ty
                .row_bytes(n)
                .ok_or_else(|| bad("size overflows".into()))?;
            let offset = data_offset
                .checked_add(t.data_offset())
                .ok_or_else(|| bad("offset overflows".into()))?;
            let end = offset
                .checked_add(n_bytes)
                .ok_or_else(|| bad("offset overflows".into()))?;
            if end > data.len() as u64 {
                return Err(bad(format!(
                    "data [{offset}, {end}) runs past the end of the file ({} bytes)",
                    data.len()
                )));
            }
            if index.insert(name.clone(), tensors.len()).is_some() {
                return Err(GgufError::Duplicate {
                    kind: "tensor",
                    name,
                });
            }
            tensors.push(TensorInfo {
                name,
                ty,
                shape,
                offset,
                n_bytes,
            });
        }
        Ok(Self {
            path,
            bytes,
            version: scan.version,
            metadata,
            tensors,
            index,
            alignment,
            data_offset,
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
