//! m40-tokenizer: GGUF tokenizers on Hugging Face `tokenizers`, a streaming
//! detokenizer, and chat templates on minijinja.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = m40_gguf::GgufFile::open("model.gguf")?;
//! let tok = m40_tokenizer::Tokenizer::from_gguf(&file)?;
//! let ids = tok.encode("Hello, world!", m40_tokenizer::Encode::default())?;
//! assert_eq!(tok.decode(&ids)?, "Hello, world!");
//! # Ok(()) }
//! ```

mod bytes;
pub mod error;
mod hf;
mod pre;
mod stream;
pub mod template;
mod ugm;
pub mod vocab;
mod wpm;

use std::collections::BTreeSet;
use tokenizers::{OffsetReferential, OffsetType};

pub use bytes::TokenBytes;
pub use error::{Result, TokenizerError};
pub use pre::PreSplit;
pub use stream::StreamDecoder;
pub use template::{ChatTemplate, FunctionCall, Message, ToolCall};
pub use vocab::{TokenType, Vocab, VocabKind};

/// Options for [`Tokenizer::encode`].
#[derive(Clone, Copy, Debug)]
pub struct Encode {
    /// Match control tokens such as `<|im_start|>` written in the text
    /// (otherwise they are tokenized as plain text).
    pub parse_special: bool,
    /// Add BOS/EOS as the model's metadata asks (`add_bos_token`, `add_eos_token`).
    pub add_special: bool,
}

impl Default for Encode {
    fn default() -> Self {
        Self {
            parse_special: true,
            add_special: false,
        }
    }
}

/// A model's tokenizer.
pub struct Tokenizer {
    vocab: Vocab,
    /// Parses control tokens in the input.
    parsing: tokenizers::Tokenizer,
    /// Treats control tokens in the input as text.
    literal: tokenizers::Tokenizer,
    split: Option<PreSplit>,
    /// The Unigram segmenter (`t5` vocabularies).
    ugm: Option<ugm::Ugm>,
    /// The WordPiece segmenter (`bert` vocabularies).
    wpm: Option<wpm::Wpm>,
    eog: BTreeSet<u32>,
}

/// Token strings that end generation even when the metadata does not say so
/// (llama.cpp's list).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<EOT>",
    "<|eom_id|>",
    "<｜end▁of▁sentence｜>",
    "_<EOT>",
    "<|return|>",
    "<|call|>",
];

impl Tokenizer {
    pub fn from_gguf(file: &m40_gguf::GgufFile) -> Result<Self> {
        Self::from_vocab(Vocab::from_metadata(file.metadata())?)
    }

    pub fn from_vocab(vocab: Vocab) -> Result<Self> {
        let (parsing, split) = hf::build(&vocab)?;
        let mut literal = parsing.clone();
        literal.set_encode_special_tokens(true);
        let mut eog: BTreeSet<u32> = [vocab.eos, vocab.eot, vocab.eom]
            .into_iter()
            .flatten()
            .collect();
        for (i, (t, ty)) in vocab.tokens.iter().zip(&vocab.types).enumerate() {
            if matches!(ty, TokenType::Control | TokenType::UserDefined)
                && EOG_TEXTS.contains(&t.as_str())
            {
                eog.insert(i as u32);
            }
        }
        // Harmony (gpt-oss): `<|end|>` ends a message, not the turn; the
        // turn ends at `<|return|>` (an answer) or `<|call|>` (a tool call).
        let find = |text: &str| vocab.tokens.iter().position(|t| t == text);
        if let (Some(end), Some(_), Some(_)) =
            (find("<|end|>"), find("<|return|>"), find("<|call|>"))
        {
            eog.remove(&(end as u32));
        }
        let ugm = match vocab.kind {
            VocabKind::Ugm => Some(ugm::Ugm::new(&vocab)?),
            _ => None,
        };
        let wpm = match vocab.kind {
            VocabKind::Wpm => Some(wpm::Wpm::new(&vocab)?),
            _ => None,
        };
        Ok(Self {
            vocab,
            parsing,
            literal,
            split,
            ugm,
            wpm,
            eog,
        })
    }

    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    pub fn n_vocab(&self) -> usize {
        self.vocab.tokens.len()
    }

    /// The pre-tokenizer split in use (byte-level BPE only).
    pub fn pre_split(&self) -> Option<PreSplit> {
        self.split
    }

    /// Text to token ids.
    pub fn encode(&self, text: &str, opts: Encode) -> Result<Vec<u32>> {
        let tk = if opts.parse_special {
            &self.parsing
        } else {
            &self.literal
        };
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        // WordPiece's specials are always [CLS] ... [SEP] (llama.cpp's).
        let wpm = self.wpm.is_some();
        if opts.add_special && (self.vocab.add_bos || wpm) {
            ids.extend(self.vocab.bos);
        }
        if self.ugm.is_some() || self.wpm.is_some() {
            // Special tokens split off as for the other models, each
            // stretch of text between them segmented on its own.
            let pre = tk
                .get_added_vocabulary()
                .extract_and_normalize(None::<&tokenizers::NormalizerWrapper>, text);
            for (piece, _, tokens) in pre.get_splits(OffsetReferential::Original, OffsetType::Byte)
            {
                match (tokens, &self.ugm, &self.wpm) {
                    (Some(tokens), _, _) => ids.extend(tokens.iter().map(|t| t.id)),
                    (None, Some(ugm), _) => ugm.encode(piece, &mut ids)?,
                    (None, None, Some(wpm)) => wpm.encode(piece, &mut ids),
                    (None, None, None) => unreachable!("a segmenter of ours"),
                }
            }
        } else {
            let enc = tk.encode_fast(text, false).map_err(error::hf)?;
            ids.extend_from_slice(enc.get_ids());
        }
        if opts.add_special && self.vocab.add_eos && !wpm {
            ids.extend(self.vocab.eos);
        }
        if opts.add_special && (self.vocab.add_sep || wpm) {
            ids.extend(self.vocab.sep);
        }
        Ok(ids)
    }

    /// The special token [`Tokenizer::encode`] ends a text with when it
    /// adds them: WordPiece's `[SEP]`, else the EOS where the vocabulary
    /// adds one.
    pub fn closing_special(&self) -> Option<u32> {
        let v = &self.vocab;
        if v.add_sep || self.wpm.is_some() {
            v.sep
        } else if v.add_eos {
            v.eos
        } else {
            None
        }
    }

    /// An error naming the first id that is not in the vocabulary.
    pub fn check(&self, ids: &[u32]) -> Result<()> {
        match ids.iter().find(|&&i| i as usize >= self.n_vocab()) {
            Some(&id) => Err(TokenizerError::BadId {
                id,
                n_vocab: self.n_vocab(),
            }),
            None => Ok(()),
        }
    }

    /// Token ids to text; control tokens render as nothing.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.check(ids)?;
        match self.vocab.kind {
            VocabKind::Spm | VocabKind::SpmBpe | VocabKind::Ugm => Ok(self.spm_decode(ids, true)),
            VocabKind::Bpe | VocabKind::Wpm => self.parsing.decode(ids, true).map_err(error::hf),
        }
    }

    /// Token ids to text with control tokens written out.
    pub fn decode_with_special(&self, ids: &[u32]) -> Result<String> {
        self.check(ids)?;
        match self.vocab.kind {
            VocabKind::Spm | VocabKind::SpmBpe | VocabKind::Ugm => Ok(self.spm_decode(ids, false)),
            VocabKind::Bpe | VocabKind::Wpm => self.parsing.decode(ids, false).map_err(error::hf),
        }
    }

    /// SentencePiece decoding as llama.cpp does it: pieces with `▁` as spaces,
    /// byte tokens as raw bytes, the whole as (lossy) UTF-8, then the one space
    /// the encoder prepended removed. HF's ByteFallback decoder would instead
    /// turn a whole run of byte tokens into U+FFFD when any byte of it is
    /// invalid, so a later token could rewrite text already streamed.
    fn spm_decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            let piece = &self.vocab.tokens[id as usize];
            match self.vocab.types[id as usize] {
                TokenType::Control | TokenType::Unknown if skip_special => {}
                TokenType::Byte => match vocab::byte_token_value(piece) {
                    Some(b) => bytes.push(b),
                    None => bytes.extend_from_slice(piece.as_bytes()),
                },
                _ => bytes.extend_from_slice(piece.replace('▁', " ").as_bytes()),
            }
        }
        let text = String::from_utf8_lossy(&bytes);
        let text = if self.vocab.add_space_prefix {
            text.strip_prefix(' ').unwrap_or(&text)
        } else {
            &text
        };
        text.to_string()
    }

    /// The vocabulary string of a token (`▁Hello`, `ĠHello`, `<0x0A>`).
    pub fn piece(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(String::as_str)
    }

    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.vocab.types.get(id as usize).copied()
    }

    /// The id of a token string, if it is in the vocabulary.
    pub fn token_id(&self, piece: &str) -> Option<u32> {
        self.parsing.token_to_id(piece)
    }

    /// Whether `id` ends generation (EOS, EOT, EOM, `<|im_end|>`-style tokens).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// All end-of-generation ids.
    pub fn eog_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.eog.iter().copied()
    }

    pub fn bos(&self) -> Option<u32> {
        self.vocab.bos
    }

    /// Fill-in-the-middle's prefix, suffix and middle tokens, where the
    /// vocabulary has them (StarCoder's `<fim_prefix>`, Qwen2.5-Coder's
    /// `<|fim_prefix|>`, DeepSeek-Coder's `<｜fim▁begin｜>`, CodeLlama's
    /// `<PRE>`), as llama.cpp finds them.
    pub fn fim_tokens(&self) -> Option<[u32; 3]> {
        fim_tokens_in(|t| self.token_id(t))
    }

    pub fn eos(&self) -> Option<u32> {
        self.vocab.eos
    }

    /// A detokenizer fed one id at a time.
    pub fn stream(&self) -> StreamDecoder<&Tokenizer> {
        StreamDecoder::new(self, false)
    }

    /// A streaming decoder that writes control tokens out (`<|python_tag|>`,
    /// `[TOOL_CALLS]`, harmony's `<|channel|>`), for parsing what a model
    /// writes around its answer.
    pub fn stream_with_special(&self) -> StreamDecoder<&Tokenizer> {
        StreamDecoder::new(self, true)
    }
}

/// Fill-in-the-middle's prefix, suffix and middle tokens of a vocabulary
/// whose token ids `id` gives (see [`Tokenizer::fim_tokens`]).
pub fn fim_tokens_in(id: impl Fn(&str) -> Option<u32>) -> Option<[u32; 3]> {
    const SETS: [[&str; 3]; 5] = [
        ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"],
        ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"],
        ["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"],
        ["<PRE>", "<SUF>", "<MID>"],
        ["▁<PRE>", "▁<SUF>", "▁<MID>"],
    ];
    SETS.iter().find_map(|set| {
        let ids: Vec<u32> = set.iter().filter_map(|t| id(t)).collect();
        <[u32; 3]>::try_from(ids).ok()
    })
}
