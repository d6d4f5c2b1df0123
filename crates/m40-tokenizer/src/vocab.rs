//! The vocabulary as GGUF stores it (`tokenizer.ggml.*`).

use m40_gguf::metadata::{Array, Metadata};

use crate::error::{Result, TokenizerError};
use crate::pre::PreSplit;

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    fn from_i64(v: i64) -> Self {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// Which tokenizer algorithm the vocabulary needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// `llama`: SentencePiece BPE with byte fallback; merges come from scores.
    Spm,
    /// `gpt2`: byte-level BPE with explicit merges and a pre-tokenizer split.
    Bpe,
    /// `gemma4`: BPE with explicit merges over SentencePiece-style text (`▁`
    /// for spaces, raw UTF-8 with byte fallback), split only at newlines;
    /// also `gpt2` with a pre that reads raw UTF-8 (`sarvam-moe`,
    /// `whitespace`: see `PreSplit::byte_level`).
    SpmBpe,
    /// `t5`: SentencePiece's Unigram (T5, XLM-R embeddings): the best
    /// segmentation by token scores after the precompiled character map.
    Ugm,
    /// `bert`: WordPiece. GGUF stores word-initial pieces with a leading `▁`
    /// and continuations bare (llama.cpp's converter turns BERT's `##x` into
    /// `x` and `x` into `▁x`).
    Wpm,
}

/// Everything `tokenizer.ggml.*` says.
#[derive(Clone, Debug)]
pub struct Vocab {
    pub kind: VocabKind,
    /// `tokenizer.ggml.pre` (BPE only), e.g. `llama-bpe`, `qwen2`, `smollm`.
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub scores: Vec<f32>,
    pub types: Vec<TokenType>,
    pub merges: Vec<String>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    /// WordPiece's separator (`[SEP]`: `tokenizer.ggml.seperator_token_id`,
    /// BERT's 102 where absent), added after the text where `add_sep`
    /// (`tokenizer.ggml.add_sep_token`; WordPiece's default, as llama.cpp).
    pub sep: Option<u32>,
    pub add_sep: bool,
    /// WordPiece's normalizer (`tokenizer.ggml.normalizer.lowercase` and
    /// `.strip_accents`; llama.cpp's defaults: both, unless the pre is
    /// `whitespace`, and accents stripped where lowercased).
    pub lowercase: bool,
    pub strip_accents: bool,
    pub add_space_prefix: bool,
    /// `tokenizer.ggml.remove_extra_whitespaces` (Unigram): one space
    /// before each word, none elsewhere.
    pub remove_extra_whitespaces: bool,
    /// `tokenizer.ggml.precompiled_charsmap` (Unigram): SentencePiece's
    /// normalization map.
    pub precompiled_charsmap: Option<Vec<u8>>,
    /// `tokenizer.chat_template`, if the model carries one.
    pub chat_template: Option<String>,
}

impl Vocab {
    pub fn from_metadata(md: &Metadata) -> Result<Self> {
        let model = md
            .opt_str("tokenizer.ggml.model")?
            .ok_or(TokenizerError::NoTokenizer)?;
        let kind = match model {
            "llama" => VocabKind::Spm,
            "gpt2" => bpe_kind(md.opt_str("tokenizer.ggml.pre")?),
            "gemma4" => VocabKind::SpmBpe,
            "bert" => VocabKind::Wpm,
            "t5" => VocabKind::Ugm,
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let tokens = md
            .opt_str_array("tokenizer.ggml.tokens")?
            .ok_or_else(|| TokenizerError::BadVocab("tokenizer.ggml.tokens is missing".into()))?
            .to_vec();
        let n = tokens.len();
        if n == 0 || n > u32::MAX as usize {
            return Err(TokenizerError::BadVocab(format!("{n} tokens")));
        }
        let scores = match md.opt_f32_array("tokenizer.ggml.scores")? {
            Some(s) if s.len() == n => s.to_vec(),
            Some(s) => {
                return Err(TokenizerError::BadVocab(format!(
                    "{} scores for {n} tokens",
                    s.len()
                )))
            }
            None => vec![0.0; n],
        };
        let types = match md.opt_int_array("tokenizer.ggml.token_type")? {
            Some(t) if t.len() == n => t.into_iter().map(TokenType::from_i64).collect(),
            Some(t) => {
                return Err(TokenizerError::BadVocab(format!(
                    "{} token types for {n} tokens",
                    t.len()
                )))
            }
            None => vec![TokenType::Normal; n],
        };
        let merges = md
            .opt_str_array("tokenizer.ggml.merges")?
            .map(<[String]>::to_vec)
            .unwrap_or_default();
        if matches!(kind, VocabKind::Bpe | VocabKind::SpmBpe) && merges.is_empty() {
            return Err(TokenizerError::BadVocab(format!(
                "a {model} tokenizer needs tokenizer.ggml.merges"
            )));
        }
        let id = |key: &str| -> Result<Option<u32>> {
            match md.opt_i64(key)? {
                Some(v) if v >= 0 && (v as usize) < n => Ok(Some(v as u32)),
                // llama.cpp ignores out-of-range special ids (with a warning); so do we.
                Some(v) => {
                    tracing::warn!("{key} = {v} is outside the vocabulary of {n}; ignored");
                    Ok(None)
                }
                None => Ok(None),
            }
        };
        let default_bos = matches!(kind, VocabKind::Spm | VocabKind::SpmBpe | VocabKind::Wpm);
        let wpm = kind == VocabKind::Wpm;
        // BERT's `[CLS]` (101) and `[SEP]` (102), llama.cpp's defaults of a
        // bert vocabulary; its converter may write the first as cls.
        let wpm_default = |id: Option<u32>, v: u32| match id {
            None if wpm && (v as usize) < n => Some(v),
            other => other,
        };
        let bos = match id("tokenizer.ggml.bos_token_id")? {
            None if wpm => wpm_default(id("tokenizer.ggml.cls_token_id")?, 101),
            other => other,
        };
        let sep = wpm_default(id("tokenizer.ggml.seperator_token_id")?, 102);
        let pre = md.opt_str("tokenizer.ggml.pre")?;
        let lowercase = md
            .opt_bool("tokenizer.ggml.normalizer.lowercase")?
            .unwrap_or(pre != Some("whitespace"));
        let strip_accents = md
            .opt_bool("tokenizer.ggml.normalizer.strip_accents")?
            .unwrap_or(lowercase);
        // llama.cpp's defaults for a t5 vocabulary: EOS 1, unknown 2, pad 0.
        let ugm_default = |key: &str, v: u32| -> Result<Option<u32>> {
            match id(key)? {
                None if kind == VocabKind::Ugm && (v as usize) < n => Ok(Some(v)),
                other => Ok(other),
            }
        };
        let precompiled_charsmap = match md.opt_array("tokenizer.ggml.precompiled_charsmap")? {
            None => None,
            Some(Array::U8(b)) => Some(b.clone()),
            Some(Array::I8(b)) => Some(b.iter().map(|&x| x as u8).collect()),
            Some(other) => {
                return Err(TokenizerError::BadVocab(format!(
                    "tokenizer.ggml.precompiled_charsmap is an array of {}, not bytes",
                    other.element_type_name()
                )))
            }
        };
        Ok(Vocab {
            kind,
            pre: md.opt_str("tokenizer.ggml.pre")?.map(str::to_string),
            scores,
            types,
            merges,
            bos,
            sep,
            add_sep: md.opt_bool("tokenizer.ggml.add_sep_token")?.unwrap_or(wpm),
            lowercase,
            strip_accents,
            eos: ugm_default("tokenizer.ggml.eos_token_id", 1)?,
            eot: id("tokenizer.ggml.eot_token_id")?,
            eom: id("tokenizer.ggml.eom_token_id")?,
            unk: ugm_default("tokenizer.ggml.unknown_token_id", 2)?,
            pad: ugm_default("tokenizer.ggml.padding_token_id", 0)?,
            add_bos: md
                .opt_bool("tokenizer.ggml.add_bos_token")?
                .unwrap_or(default_bos),
            add_eos: md
                .opt_bool("tokenizer.ggml.add_eos_token")?
                .unwrap_or(kind == VocabKind::Ugm),
            add_space_prefix: md
                .opt_bool("tokenizer.ggml.add_space_prefix")?
                .unwrap_or(kind == VocabKind::Spm),
            remove_extra_whitespaces: md
                .opt_bool("tokenizer.ggml.remove_extra_whitespaces")?
                .unwrap_or(false),
            precompiled_charsmap,
            chat_template: md.opt_str("tokenizer.chat_template")?.map(str::to_string),
            tokens,
        })
    }
}

/// The kind of a `gpt2` vocabulary with this pre: a pre that reads raw
/// UTF-8 makes it gemma4's kind.
fn bpe_kind(pre: Option<&str>) -> VocabKind {
    match pre.and_then(PreSplit::from_pre) {
        Some(split) if !split.byte_level() => VocabKind::SpmBpe,
        _ => VocabKind::Bpe,
    }
}

impl Vocab {
    /// The vocabulary read with another `tokenizer.ggml.pre`, as llama.cpp
    /// reads a BPE model with that pre (a raw UTF-8 pre makes it gemma4's
    /// kind). SentencePiece and WordPiece vocabularies only record it.
    pub fn with_pre(mut self, pre: &str) -> Self {
        if matches!(self.kind, VocabKind::Bpe | VocabKind::SpmBpe) {
            self.kind = bpe_kind(Some(pre));
        }
        self.pre = Some(pre.to_string());
        self
    }
}

/// The byte a SentencePiece byte token (`<0x0A>`) stands for.
pub(crate) fn byte_token_value(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
