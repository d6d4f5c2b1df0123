use m40_gguf::GgufError;

/// Tokenizer and template errors.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("the model has no tokenizer (no tokenizer.ggml.model)")]
    NoTokenizer,
    #[error("unsupported tokenizer model `{0}`: m40-llm reads `llama` (SentencePiece), `gpt2` (byte-level BPE), `gemma4` (BPE over SentencePiece text), `t5` (Unigram) and `bert` (WordPiece)")]
    UnsupportedModel(String),
    #[error("bad tokenizer metadata: {0}")]
    BadVocab(String),
    #[error("tokenizer: {0}")]
    Hf(String),
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadId { id: u32, n_vocab: usize },
    #[error("chat template syntax: {0}")]
    TemplateSyntax(String),
    #[error("chat template error: {0}")]
    TemplateRender(String),
    /// The template refused the conversation with `raise_exception(message)`.
    #[error("chat template refused the conversation: {0}")]
    TemplateRaised(String),
}

pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;

pub(crate) fn hf(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Hf(e.to_string())
}
