//! The GGUF header (metadata and tensor descriptors), decoded by a
//! bounds-checked walk over the mapped bytes.
//!
//! Why not gguf-rs-lib's reader (the writer still uses the library): it reads
//! from a stream and so cannot know, when a length field says 2^40, that the
//! file has 200 bytes left; its errors carry no byte offset or key name; and
//! it is stricter than llama.cpp, rejecting keys that are not dot-separated
//! lower_snake_case (`command-r.attention.layer_norm_epsilon`, every
//! `gpt-oss.*` key). This walk allocates nothing in proportion to a length
//! field before checking it against the bytes that remain, names the offset
//! and key of the first problem, and takes any UTF-8 key, as llama.cpp does.

use std::collections::HashSet;

use crate::error::{GgufError, Result};
use crate::metadata::{Array, Metadata, Value};
use crate::types::GgmlType;

pub(crate) const MAGIC: u32 = 0x4655_4747;
const MAX_DIMS: u32 = 4;
const MAX_ARRAY_NESTING: u32 = 8;

/// One tensor's descriptor: checked against the file (its data lies inside
/// it, its row length is whole blocks), offset from the data section.
pub(crate) struct Descriptor {
    pub name: String,
    pub ty: GgmlType,
    pub shape: Vec<u64>,
    pub offset: u64,
    pub n_bytes: u64,
}

/// A decoded header.
pub(crate) struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<Descriptor>,
    pub alignment: u64,
    /// Where the data section starts: the descriptors' end, aligned.
    pub data_offset: u64,
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                offset: self.pos as u64,
                file_size: self.bytes.len() as u64,
                what: what(),
            });
        }
        let s = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        Ok(self.take(N as u64, what)?.try_into().expect("took N bytes"))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn malformed(&self, at: usize, what: String) -> GgufError {
        GgufError::Malformed {
            offset: at as u64,
            what,
        }
    }

    /// A GGUF string: u64 length then UTF-8 bytes.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<&'a str> {
        let at = self.pos;
        let len = self.u64(what)?;
        if len > self.remaining() {
            return Err(self.malformed(
                at,
                format!(
                    "{} has length {len}, past the end of the file ({} bytes left)",
                    what(),
                    self.remaining()
                ),
            ));
        }
        let b = self.take(len, what)?;
        std::str::from_utf8(b)
            .map_err(|_| self.malformed(at, format!("{} is not valid UTF-8", what())))
    }
}

/// Size in bytes of a fixed-size GGUF value type, `None` for string and array.
fn fixed_size(value_type: u32) -> Option<u64> {
    match value_type {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

fn read_value(c: &mut Cursor<'_>, key: &str, value_type: u32, depth: u32) -> Result<Value> {
    let what = || format!("value of `{key}`");
    let at = c.pos;
    Ok(match value_type {
        0 => Value::U8(c.take(1, &what)?[0]),
        1 => Value::I8(c.take(1, &what)?[0] as i8),
        2 => Value::U16(u16::from_le_bytes(c.array(&what)?)),
        3 => Value::I16(i16::from_le_bytes(c.array(&what)?)),
        4 => Value::U32(u32::from_le_bytes(c.array(&what)?)),
        5 => Value::I32(i32::from_le_bytes(c.array(&what)?)),
        6 => Value::F32(f32::from_le_bytes(c.array(&what)?)),
        7 => match c.take(1, &what)?[0] {
            0 => Value::Bool(false),
            1 => Value::Bool(true),
            b => return Err(c.malformed(at, format!("bool value of `{key}` is {b}, not 0 or 1"))),
        },
        8 => Value::String(c.string(&what)?.to_string()),
        9 => Value::Array(read_array(c, key, depth)?),
        10 => Value::U64(u64::from_le_bytes(c.array(&what)?)),
        11 => Value::I64(i64::from_le_bytes(c.array(&what)?)),
        12 => Value::F64(f64::from_le_bytes(c.array(&what)?)),
        other => return Err(c.malformed(at - 4, format!("`{key}` has unknown value type {other}"))),
    })
}

/// `n` elements of a fixed-size type, each decoded by `f` from its bytes.
fn elements<T, const N: usize>(
    c: &mut Cursor<'_>,
    n: u64,
    what: &dyn Fn() -> String,
    f: impl Fn([u8; N]) -> T,
) -> Result<Vec<T>> {
    // The caller checked n * N against the bytes left.
    let b = c.take(n * N as u64, what)?;
    Ok(b.chunks_exact(N)
        .map(|e| f(e.try_into().expect("chunks of N")))
        .collect())
}

fn read_array(c: &mut Cursor<'_>, key: &str, depth: u32) -> Result<Array> {
    let what = || format!("value of `{key}`");
    let at = c.pos;
    if depth >= MAX_ARRAY_NESTING {
        return Err(c.malformed(
            at,
            format!("arrays in `{key}` nest deeper than {MAX_ARRAY_NESTING}"),
        ));
    }
    let elem = c.u32(&what)?;
    let len = c.u64(&what)?;
    // Every element takes at least one byte (strings and arrays eight).
    let min_elem = fixed_size(elem).unwrap_or(8);
    if len
        .checked_mul(min_elem)
        .is_none_or(|need| need > c.remaining())
    {
        return Err(c.malformed(
            at,
            format!(
                "array `{key}` claims {len} elements, more than the {} bytes left can hold",
                c.remaining()
            ),
        ));
    }
    let w = &what;
    Ok(match elem {
        0 => Array::U8(elements(c, len, w, |[b]: [u8; 1]| b)?),
        1 => Array::I8(elements(c, len, w, |[b]: [u8; 1]| b as i8)?),
        2 => Array::U16(elements(c, len, w, u16::from_le_bytes)?),
        3 => Array::I16(elements(c, len, w, i16::from_le_bytes)?),
        4 => Array::U32(elements(c, len, w, u32::from_le_bytes)?),
        5 => Array::I32(elements(c, len, w, i32::from_le_bytes)?),
        6 => Array::F32(elements(c, len, w, f32::from_le_bytes)?),
        10 => Array::U64(elements(c, len, w, u64::from_le_bytes)?),
        11 => Array::I64(elements(c, len, w, i64::from_le_bytes)?),
        12 => Array::F64(elements(c, len, w, f64::from_le_bytes)?),
        7 => {
            let b = elements(c, len, w, |[b]: [u8; 1]| b)?;
            if let Some(bad) = b.iter().find(|&&v| v > 1) {
                return Err(c.malformed(at, format!("bool in array `{key}` is {bad}, not 0 or 1")));
            }
            Array::Bool(b.into_iter().map(|v| v == 1).collect())
        }
        8 => Array::String(
            (0..len)
                .map(|_| c.string(w).map(str::to_string))
                .collect::<Result<_>>()?,
        ),
        // An array's elements are arrays (their own element type and length, then data).
        9 => Array::Array(
            (0..len)
                .map(|_| read_array(c, key, depth + 1))
                .collect::<Result<_>>()?,
        ),
        other => {
            return Err(c.malformed(
                at,
                format!("array `{key}` has unknown element type {other}"),
            ))
        }
    })
}

/// Decode the header, metadata and tensor descriptors of `bytes`, checking
/// every length against the bytes that remain.
pub(crate) fn read_header(bytes: &[u8]) -> Result<Header> {
    let mut c = Cursor { bytes, pos: 0 };
    let magic = c.u32(&|| "magic".into())?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = c.u32(&|| "version".into())?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let tensor_count = c.u64(&|| "tensor count".into())?;
    let kv_count = c.u64(&|| "metadata count".into())?;
    // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes, a
    // tensor descriptor at least 8 + 4 + 8 + 4 + 8.
    let left = c.remaining();
    if kv_count.checked_mul(13).is_none_or(|n| n > left) {
        return Err(c.malformed(
            16,
            format!(
                "metadata count {kv_count} cannot fit in a {} byte file",
                bytes.len()
            ),
        ));
    }
    if tensor_count.checked_mul(32).is_none_or(|n| n > left) {
        return Err(c.malformed(
            8,
            format!(
                "tensor count {tensor_count} cannot fit in a {} byte file",
                bytes.len()
            ),
        ));
    }

    let mut metadata = Metadata::new();
    for i in 0..kv_count {
        let key = c.string(&|| format!("key of metadata entry {i}"))?;
        if metadata.contains(key) {
            return Err(GgufError::Duplicate {
                kind: "metadata key",
                name: key.to_string(),
            });
        }
        let ty = c.u32(&|| format!("type of `{key}`"))?;
        let value = read_value(&mut c, key, ty, 0)?;
        metadata.insert(key, value);
    }
    // llama.cpp's rule: `general.alignment`, when present, is a u32 power of two.
    let alignment = match metadata.get("general.alignment") {
        None => 32,
        Some(Value::U32(a)) if a.is_power_of_two() => u64::from(*a),
        Some(v) => {
            return Err(GgufError::Malformed {
                offset: 0,
                what: format!("general.alignment is {v}, not a u32 power of two"),
            })
        }
    };

    let mut names = HashSet::new();
    let mut tensors = Vec::with_capacity(tensor_count as usize);
    // How far the data section reaches past its start.
    let mut data_len = 0u64;
    for i in 0..tensor_count {
        let at = c.pos;
        let name = c.string(&|| format!("name of tensor {i}"))?;
        if !names.insert(name) {
            return Err(GgufError::Duplicate {
                kind: "tensor",
                name: name.to_string(),
            });
        }
        let what = || format!("descriptor of tensor `{name}`");
        let n_dims = c.u32(&what)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(c.malformed(
                at,
                format!("tensor `{name}` has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"),
            ));
        }
        let mut elements: u64 = 1;
        let mut dims = [0u64; MAX_DIMS as usize];
        for d in dims.iter_mut().take(n_dims as usize) {
            *d = c.u64(&what)?;
            if *d == 0 {
                return Err(GgufError::BadTensor {
                    name: name.into(),
                    what: "has a zero dimension".into(),
                });
            }
            elements = elements
                .checked_mul(*d)
                .ok_or_else(|| GgufError::BadTensor {
                    name: name.into(),
                    what: "element count overflows 64 bits".into(),
                })?;
        }
        let type_id = c.u32(&what)?;
        let ty = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownType {
            name: name.into(),
            id: type_id,
        })?;
        if dims[0] % ty.block_len() as u64 != 0 {
            return Err(GgufError::BadTensor {
                name: name.into(),
                what: format!(
                    "row length {} is not a multiple of the {ty} block size {}",
                    dims[0],
                    ty.block_len()
                ),
            });
        }
        let size = ty.row_bytes(elements).ok_or_else(|| GgufError::BadTensor {
            name: name.into(),
            what: "byte size overflows 64 bits".into(),
        })?;
        let offset = c.u64(&what)?;
        if offset % alignment != 0 {
            return Err(GgufError::BadTensor {
                name: name.into(),
                what: format!(
                    "data offset {offset} is not a multiple of the alignment {alignment}"
                ),
            });
        }
        data_len = data_len.max(offset.saturating_add(size));
        if offset
            .checked_add(size)
            .is_none_or(|end| end > bytes.len() as u64)
        {
            return Err(GgufError::BadTensor {
                name: name.into(),
                what: format!("data ({size} bytes at data offset {offset}) runs past the end of the {} byte file", bytes.len()),
            });
        }
        tensors.push(Descriptor {
            name: name.to_string(),
            ty,
            shape: dims[..n_dims as usize].to_vec(),
            offset,
            n_bytes: size,
        });
    }
    // The data section starts at the next multiple of the alignment; a file
    // that stops before its last tensor ends was cut short.
    let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
    let needed = data_offset.saturating_add(data_len);
    if tensor_count > 0 && needed > bytes.len() as u64 {
        return Err(GgufError::Incomplete {
            needed,
            file_size: bytes.len() as u64,
        });
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}
