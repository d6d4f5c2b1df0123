//! Structured outputs: a grammar (JSON schema, Lark, GBNF, regex) compiled
//! by llguidance against the model's vocabulary, and for each step of a
//! constrained sequence the mask of tokens that keep the output inside it.
//!
//! [`Grammars`] is built once per model (the token trie: every token's
//! bytes, control tokens marked as llguidance expects); [`Grammars::compile`]
//! checks a request's grammar before it queues (an error names what the
//! engine does not support); the [`Constraint`] it returns follows one
//! sequence: [`Constraint::mask`] before each sampled token,
//! [`Constraint::accept`] after.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use m40_tokenizer::{TokenBytes, Tokenizer};
use serde_json::Value;

/// What a constrained answer must be.
#[derive(Clone, Debug, PartialEq)]
pub enum Format {
    /// A JSON object (Ollama's `format: "json"`, OpenAI's `json_object`).
    Json,
    /// A JSON document valid under this schema.
    JsonSchema(Value),
    /// A grammar in llguidance's Lark syntax.
    Lark(String),
    /// A grammar in llama.cpp's GBNF (its `root` rule is the start).
    Gbnf(String),
    /// Text matching this regular expression (Rust `regex` syntax).
    Regex(String),
}

/// A grammar the engine cannot use, or a constraint that failed mid-way.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FormatError {
    #[error("the format cannot be used: {0}")]
    Unsupported(String),
    #[error("the tokenizer cannot be constrained: {0}")]
    Vocabulary(String),
    #[error("the constraint failed: {0}")]
    Failed(String),
}

/// The allowed tokens of one step: bit `id % 32` of word `id / 32`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
}

impl TokenMask {
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    pub fn into_words(self) -> Vec<u32> {
        self.words
    }

    /// Whether `id` may come next (ids past the mask may not).
    pub fn allows(&self, id: u32) -> bool {
        self.words
            .get(id as usize / 32)
            .is_some_and(|w| w >> (id % 32) & 1 == 1)
    }
}

/// The vocabulary as llguidance reads it: the token trie, and tokenization
/// by the trie's greedy walk (the engine never asks llguidance to force
/// tokens, so it needs no canonical tokenization).
struct Vocab {
    trie: TokTrie,
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// A model's grammar compiler: built once, used by every request.
pub struct Grammars {
    factory: ParserFactory,
    n_vocab: usize,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("n_vocab", &self.n_vocab)
            .finish_non_exhaustive()
    }
}

impl Grammars {
    /// The token trie of `tok`'s vocabulary: each token's bytes
    /// ([`Tokenizer::token_bytes`]); control tokens as llguidance's
    /// special tokens (a 0xFF byte, then the piece), which a grammar
    /// names but text never matches; the end-of-generation tokens end a
    /// finished answer.
    pub fn new(tok: &Tokenizer) -> Result<Grammars, FormatError> {
        let n = tok.n_vocab();
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| match tok.token_bytes(id) {
                Some(TokenBytes::Text(b)) => b,
                _ => {
                    let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    b.extend_from_slice(tok.piece(id).unwrap_or_default().as_bytes());
                    b
                }
            })
            .collect();
        let eog: Vec<u32> = tok.eog_ids().collect();
        let Some(&eos) = tok.eos().as_ref().or(eog.first()) else {
            return Err(FormatError::Vocabulary(
                "the vocabulary has no end-of-generation token".into(),
            ));
        };
        let mut info = TokRxInfo::new(n as u32, eos);
        info.tok_bos = tok.bos();
        info.tok_unk = tok.vocab().unk;
        info.tok_pad = tok.vocab().pad;
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eog);
        let env: TokEnv = Arc::new(Vocab { trie });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| FormatError::Vocabulary(e.to_string()))?;
        factory.quiet();
        Ok(Grammars {
            factory,
            n_vocab: n,
        })
    }

    /// A constraint for one sequence, or what is wrong with the grammar.
    pub fn compile(&self, format: &Format) -> Result<Constraint, FormatError> {
        let grammar = match format {
            Format::Json => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            Format::JsonSchema(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(FormatError::Unsupported(
                        "a JSON schema must be an object".into(),
                    ));
                }
                TopLevelGrammar::from_json_schema(compact(schema.clone()))
            }
            Format::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Format::Gbnf(g) => TopLevelGrammar::from_lark(
                crate::gbnf::to_lark(g).map_err(FormatError::Unsupported)?,
            ),
            Format::Regex(r) => TopLevelGrammar::from_regex(r),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| FormatError::Unsupported(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(FormatError::Unsupported(e));
        }
        Ok(Constraint {
            matcher,
            n_vocab: self.n_vocab,
        })
    }
}

/// A schema's layout: one line, `, ` and `: ` between items (as Python's
/// `json.dumps`), no free whitespace a model could run on in; a schema's
/// own `x-guidance` options win.
fn compact(mut schema: Value) -> Value {
    compact_json(&mut schema);
    schema
}

/// [`compact`] in place.
pub(crate) fn compact_json(schema: &mut Value) {
    if let Value::Object(m) = schema {
        m.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            })
        });
    }
}

/// One sequence's grammar state.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    n_vocab: usize,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

impl Constraint {
    /// The tokens that may come next (only end-of-generation tokens once
    /// the grammar is complete).
    pub fn mask(&mut self) -> Result<TokenMask, FormatError> {
        let v = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| FormatError::Failed(e.to_string()))?;
        let mut words = v.as_slice().to_vec();
        words.resize(self.n_vocab.div_ceil(32), 0);
        if !self.n_vocab.is_multiple_of(32) {
            *words.last_mut().expect("a vocabulary") &= (1u32 << (self.n_vocab % 32)) - 1;
        }
        Ok(TokenMask { words })
    }

    /// `id` was sampled (from the last mask).
    pub fn accept(&mut self, id: u32) -> Result<(), FormatError> {
        self.matcher
            .consume_token(id)
            .map_err(|e| FormatError::Failed(e.to_string()))
    }

    /// The grammar is complete: nothing but the end may follow.
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }
}
