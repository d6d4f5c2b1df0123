//! A bounds-checked walk over a GGUF header before gguf-rs-lib decodes it.
//!
//! Why: the library reads from a stream and so cannot know, when a length field
//! says 2^40, that the file has 200 bytes left; it grows its buffers in chunks
//! and fails at end of file, and its errors carry no byte offset or key name.
//! This walk allocates nothing in proportion to any length field, rejects every
//! count and length that does not fit in the bytes that remain, and names the
//! offset and key of the first problem. Only files that pass it reach the library.

use std::collections::HashSet;

use crate::error::{GgufError, Result};
use crate::types::GgmlType;

pub(crate) const MAGIC: u32 = 0x4655_4747;
const MAX_DIMS: u32 = 4;
const MAX_ARRAY_NESTING: u32 = 8;

/// What the walk learned that the caller checks against the library's view.
pub(crate) struct Prescan {
    pub version: u32,
    pub tensor_count: u64,
    pub kv_count: u64,
    /// Byte offset just past the last tensor descriptor.
    pub descriptors_end: u64,
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

fn skip_value(c: &mut Cursor<'_>, key: &str, value_type: u32, depth: u32) -> Result<()> {
    let what = || format!("value of `{key}`");
    if let Some(n) = fixed_size(value_type) {
        let at = c.pos;
        let b = c.take(n, &what)?;
        if value_type == 7 && b[0] > 1 {
            return Err(c.malformed(at, format!("bool value of `{key}` is {}, not 0 or 1", b[0])));
        }
        return Ok(());
    }
    match value_type {
        8 => c.string(&what).map(|_| ()),
        9 => {
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
            if let Some(n) = fixed_size(elem) {
                if elem == 7 {
                    for _ in 0..len {
                        skip_value(c, key, elem, depth + 1)?;
                    }
                    return Ok(());
                }
                c.take(len * n, &what)?;
                return Ok(());
            }
            if elem != 8 && elem != 9 {
                return Err(
                    c.malformed(at, format!("array `{key}` has unknown element type {elem}"))
                );
            }
            for _ in 0..len {
                skip_value(c, key, elem, depth + 1)?;
            }
            Ok(())
        }
        other => Err(c.malformed(c.pos - 4, format!("`{key}` has unknown value type {other}"))),
    }
}

/// Walk header, metadata and tensor descriptors of `bytes`, checking every
/// length against the bytes that remain.
pub(crate) fn prescan(bytes: &[u8]) -> Result<Prescan> {
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

    let mut keys = HashSet::new();
    let mut alignment = 32u64;
    for i in 0..kv_count {
        let key = c.string(&|| format!("key of metadata entry {i}"))?;
        if !keys.insert(key) {
            return Err(GgufError::Duplicate {
                kind: "metadata key",
                name: key.to_string(),
            });
        }
        let ty = c.u32(&|| format!("type of `{key}`"))?;
        if key == "general.alignment" && ty == 4 && c.remaining() >= 4 {
            let b = &bytes[c.pos..c.pos + 4];
            alignment = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64;
        }
        skip_value(&mut c, key, ty, 0)?;
    }

    let mut names = HashSet::new();
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
    }
    // The data section starts at the next multiple of the alignment; a file
    // that stops before its last tensor ends was cut short.
    if alignment.is_power_of_two() && tensor_count > 0 {
        let start = (c.pos as u64).div_ceil(alignment) * alignment;
        let needed = start.saturating_add(data_len);
        if needed > bytes.len() as u64 {
            return Err(GgufError::Incomplete {
                needed,
                file_size: bytes.len() as u64,
            });
        }
    }
    Ok(Prescan {
        version,
        tensor_count,
        kv_count,
        descriptors_end: c.pos as u64,
    })
}
