//! The crate's error type: structured variants that say what was wrong and where.

use std::path::PathBuf;

use crate::types::GgmlType;

/// Everything that can go wrong reading, interpreting or writing a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `found`: the first four bytes, for callers; never shown (a server must
    /// not show a client what a file holds).
    #[error("not a GGUF file: it does not start with the GGUF magic")]
    BadMagic { found: u32 },
    #[error("unsupported GGUF version {0}: m40-llm reads versions 2 and 3 (re-convert older files with llama.cpp's convert scripts)")]
    UnsupportedVersion(u32),
    #[error("malformed GGUF at byte {offset}: {what}")]
    Malformed { offset: u64, what: String },
    #[error("file ends at byte {file_size} while reading {what} at byte {offset}")]
    Truncated {
        offset: u64,
        file_size: u64,
        what: String,
    },
    #[error("the file is cut short: its tensor data ends at byte {needed} but the file has {file_size} bytes ({} missing); an interrupted download or copy? Fetch the file again", needed - file_size)]
    Incomplete { needed: u64, file_size: u64 },
    #[error("tensor `{name}` has unknown GGML type id {id}")]
    UnknownType { name: String, id: u32 },
    #[error("tensor `{name}`: {what}")]
    BadTensor { name: String, what: String },
    #[error("duplicate {kind} `{name}`")]
    Duplicate { kind: &'static str, name: String },
    #[error("metadata key `{key}` is missing")]
    MissingKey { key: String },
    #[error("metadata key `{key}`: expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("tensor `{0}` is missing")]
    MissingTensor(String),
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    WrongShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    /// `name`, and every architecture m40-llm runs (`Arch::names`).
    #[error("unsupported architecture `{name}`: m40-llm runs {known} (`llama` covers Llama, Mistral, Mixtral, SmolLM and TinyLlama files)")]
    UnsupportedArchitecture { name: String, known: String },
    #[error("invalid hyperparameters: {0}")]
    BadHyperparameters(String),
    #[error("{ty} is not supported for {op}")]
    UnsupportedType { ty: GgmlType, op: &'static str },
    #[error("row of {len} values is not a multiple of the {ty} block size {block}")]
    BadRowLength {
        ty: GgmlType,
        len: usize,
        block: usize,
    },
    #[error("writing GGUF: {0}")]
    Write(String),
}

pub type Result<T, E = GgufError> = std::result::Result<T, E>;
