//! GGUF metadata: every value type, typed access with errors that name the key.

use std::collections::BTreeMap;
use std::fmt;

use gguf_rs_lib::format::metadata::{MetadataArray, MetadataValue};
use gguf_rs_lib::format::types::GGUFValueType;

use crate::error::{GgufError, Result};

/// One metadata value. Arrays keep their element type so large tokenizer arrays
/// (tokens, scores, token types) stay compact.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

/// A homogeneous GGUF array.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type's GGUF name (`u32`, `string`, ...).
    pub fn element_type_name(&self) -> &'static str {
        match self {
            Array::U8(_) => "u8",
            Array::I8(_) => "i8",
            Array::U16(_) => "u16",
            Array::I16(_) => "i16",
            Array::U32(_) => "u32",
            Array::I32(_) => "i32",
            Array::U64(_) => "u64",
            Array::I64(_) => "i64",
            Array::F32(_) => "f32",
            Array::F64(_) => "f64",
            Array::Bool(_) => "bool",
            Array::String(_) => "string",
            Array::Array(_) => "array",
        }
    }

    /// The elements as `i64`, when this is an array of integers.
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        Some(match self {
            Array::U8(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I8(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U16(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I16(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U32(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I32(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U64(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I64(v) => v.clone(),
            _ => return None,
        })
    }
}

impl Value {
    /// A short description of the value's type, for error messages.
    pub fn type_name(&self) -> String {
        match self {
            Value::U8(_) => "u8".into(),
            Value::I8(_) => "i8".into(),
            Value::U16(_) => "u16".into(),
            Value::I16(_) => "i16".into(),
            Value::U32(_) => "u32".into(),
            Value::I32(_) => "i32".into(),
            Value::U64(_) => "u64".into(),
            Value::I64(_) => "i64".into(),
            Value::F32(_) => "f32".into(),
            Value::F64(_) => "f64".into(),
            Value::Bool(_) => "bool".into(),
            Value::String(_) => "string".into(),
            Value::Array(a) => format!("array of {} {}", a.len(), a.element_type_name()),
        }
    }

    /// The value as a signed integer, for any integer type that fits.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as `f64`, for floating-point types.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The gguf-rs-lib value, for writing.
    pub(crate) fn to_lib(&self) -> MetadataValue {
        match self {
            Value::U8(x) => MetadataValue::U8(*x),
            Value::I8(x) => MetadataValue::I8(*x),
            Value::U16(x) => MetadataValue::U16(*x),
            Value::I16(x) => MetadataValue::I16(*x),
            Value::U32(x) => MetadataValue::U32(*x),
            Value::I32(x) => MetadataValue::I32(*x),
            Value::U64(x) => MetadataValue::U64(*x),
            Value::I64(x) => MetadataValue::I64(*x),
            Value::F32(x) => MetadataValue::F32(*x),
            Value::F64(x) => MetadataValue::F64(*x),
            Value::Bool(x) => MetadataValue::Bool(*x),
            Value::String(s) => MetadataValue::String(s.clone()),
            Value::Array(a) => MetadataValue::Array(Box::new(a.to_lib())),
        }
    }
}

impl Array {
    fn to_lib(&self) -> MetadataArray {
        fn wrap<T: Clone>(
            ty: GGUFValueType,
            v: &[T],
            f: impl Fn(T) -> MetadataValue,
        ) -> MetadataArray {
            MetadataArray {
                element_type: ty,
                length: v.len() as u64,
                values: v.iter().cloned().map(f).collect(),
            }
        }
        match self {
            Array::U8(v) => wrap(GGUFValueType::U8, v, MetadataValue::U8),
            Array::I8(v) => wrap(GGUFValueType::I8, v, MetadataValue::I8),
            Array::U16(v) => wrap(GGUFValueType::U16, v, MetadataValue::U16),
            Array::I16(v) => wrap(GGUFValueType::I16, v, MetadataValue::I16),
            Array::U32(v) => wrap(GGUFValueType::U32, v, MetadataValue::U32),
            Array::I32(v) => wrap(GGUFValueType::I32, v, MetadataValue::I32),
            Array::U64(v) => wrap(GGUFValueType::U64, v, MetadataValue::U64),
            Array::I64(v) => wrap(GGUFValueType::I64, v, MetadataValue::I64),
            Array::F32(v) => wrap(GGUFValueType::F32, v, MetadataValue::F32),
            Array::F64(v) => wrap(GGUFValueType::F64, v, MetadataValue::F64),
            Array::Bool(v) => wrap(GGUFValueType::Bool, v, MetadataValue::Bool),
            Array::String(v) => wrap(GGUFValueType::String, v, MetadataValue::String),
            Array::Array(v) => MetadataArray {
                element_type: GGUFValueType::Array,
                length: v.len() as u64,
                values: v
                    .iter()
                    .map(|a| MetadataValue::Array(Box::new(a.to_lib())))
                    .collect(),
            },
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) if s.len() > 60 => {
                write!(f, "{:?}...", &s[..s.floor_char_boundary(60)])
            }
            Value::String(s) => write!(f, "{s:?}"),
            Value::Array(a) => write!(f, "[{} x {}]", a.len(), a.element_type_name()),
        }
    }
}

/// All metadata of one file, keyed by name (sorted, for stable output).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: BTreeMap<String, Value>,
}

fn wrong(key: &str, expected: &'static str, v: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: v.type_name(),
    }
}

impl Metadata {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, key: impl Into<String>, value: Value) {
        self.entries.insert(key.into(), value);
    }

    pub fn remove(&mut self, key: &str) -> Option<Value> {
        self.entries.remove(key)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.get(key)
    }

    pub fn contains(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    /// A string value; a missing key or another type is an error naming the key.
    pub fn str(&self, key: &str) -> Result<&str> {
        self.opt_str(key)?.ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    /// A string value if present; another type is an error.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(wrong(key, "string", v)),
        }
    }

    /// A non-negative integer of any integer type.
    pub fn u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        Self::to_u64(key, v)
    }

    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        self.get(key).map(|v| Self::to_u64(key, v)).transpose()
    }

    fn to_u64(key: &str, v: &Value) -> Result<u64> {
        match v.as_i128() {
            Some(i) => u64::try_from(i).map_err(|_| wrong(key, "a non-negative integer", v)),
            None => Err(wrong(key, "an unsigned integer", v)),
        }
    }

    /// A non-negative integer that fits `usize`.
    pub fn usize(&self, key: &str) -> Result<usize> {
        let v = self.u64(key)?;
        usize::try_from(v).map_err(|_| GgufError::WrongType {
            key: key.to_string(),
            expected: "an integer that fits usize",
            found: v.to_string(),
        })
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.opt_u64(key)? {
            None => Ok(None),
            Some(v) => usize::try_from(v)
                .map(Some)
                .map_err(|_| GgufError::WrongType {
                    key: key.to_string(),
                    expected: "an integer that fits usize",
                    found: v.to_string(),
                }),
        }
    }

    /// A signed integer of any integer type.
    pub fn opt_i64(&self, key: &str) -> Result<Option<i64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_i128().and_then(|i| i64::try_from(i).ok()) {
                Some(i) => Ok(Some(i)),
                None => Err(wrong(key, "an integer", v)),
            },
        }
    }

    /// A floating-point value (f32 or f64; integers are accepted too, as some
    /// converters write `rope.freq_base` as an integer).
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match (v.as_f64(), v.as_i128()) {
                (Some(f), _) => Ok(Some(f)),
                (None, Some(i)) => Ok(Some(i as f64)),
                _ => Err(wrong(key, "a number", v)),
            },
        }
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(wrong(key, "bool", v)),
        }
    }

    /// An array of any element type.
    pub fn opt_array(&self, key: &str) -> Result<Option<&Array>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(wrong(key, "array", v)),
        }
    }

    pub fn opt_str_array(&self, key: &str) -> Result<Option<&[String]>> {
        match self.opt_array(key)? {
            None => Ok(None),
            Some(Array::String(v)) => Ok(Some(v)),
            Some(a) => Err(wrong(key, "array of string", &Value::Array(a.clone()))),
        }
    }

    pub fn opt_f32_array(&self, key: &str) -> Result<Option<&[f32]>> {
        match self.opt_array(key)? {
            None => Ok(None),
            Some(Array::F32(v)) => Ok(Some(v)),
            Some(a) => Err(GgufError::WrongType {
                key: key.to_string(),
                expected: "array of f32",
                found: format!("array of {} {}", a.len(), a.element_type_name()),
            }),
        }
    }

    /// An array of integers of any integer element type, widened to i64.
    pub fn opt_int_array(&self, key: &str) -> Result<Option<Vec<i64>>> {
        match self.opt_array(key)? {
            None => Ok(None),
            Some(a) => a
                .to_i64_vec()
                .map(Some)
                .ok_or_else(|| GgufError::WrongType {
                    key: key.to_string(),
                    expected: "array of integers",
                    found: format!("array of {} {}", a.len(), a.element_type_name()),
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_access_names_key_and_found_type() {
        let mut m = Metadata::new();
        m.insert("a.count", Value::U32(7));
        m.insert("a.name", Value::String("x".into()));
        m.insert("a.neg", Value::I32(-1));
        m.insert("a.list", Value::Array(Array::F32(vec![1.0, 2.0])));
        assert_eq!(m.u64("a.count").unwrap(), 7);
        assert_eq!(m.str("a.name").unwrap(), "x");
        let e = m.u64("a.name").unwrap_err().to_string();
        assert!(e.contains("a.name") && e.contains("string"), "{e}");
        let e = m.u64("a.neg").unwrap_err().to_string();
        assert!(e.contains("a.neg") && e.contains("non-negative"), "{e}");
        let e = m.str("missing.key").unwrap_err().to_string();
        assert!(e.contains("missing.key"), "{e}");
        let e = m.opt_str_array("a.list").unwrap_err().to_string();
        assert!(e.contains("array of 2 f32"), "{e}");
        assert_eq!(m.opt_f32_array("a.list").unwrap().unwrap(), &[1.0, 2.0]);
        assert_eq!(m.opt_f64("a.count").unwrap(), Some(7.0));
    }

    #[test]
    fn written_and_read_back_keeps_every_type() {
        let mut m = Metadata::new();
        let vals = [
            Value::U8(1),
            Value::I8(-2),
            Value::U16(3),
            Value::I16(-4),
            Value::U32(5),
            Value::I32(-6),
            Value::U64(7),
            Value::I64(-8),
            Value::F32(0.5),
            Value::F64(0.25),
            Value::Bool(true),
            Value::String("s".into()),
            Value::Array(Array::Array(vec![
                Array::I32(vec![1, 2]),
                Array::String(vec!["a".into()]),
            ])),
        ];
        for (i, v) in vals.iter().enumerate() {
            m.insert(format!("k{i}"), v.clone());
        }
        let file = crate::GgufWriter::new(Vec::new(), &m, &[])
            .and_then(|w| w.finish())
            .unwrap();
        let back = crate::GgufFile::from_bytes(file).unwrap();
        assert_eq!(back.metadata(), &m);
    }
}
