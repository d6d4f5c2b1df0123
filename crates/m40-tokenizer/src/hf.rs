//! Build a Hugging Face `tokenizers` pipeline from a GGUF vocabulary, the way
//! transformers' converters build `tokenizer.json` for the same models.

use std::collections::HashMap;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::bert::BertNormalizer;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence, NFC};
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::punctuation::Punctuation;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::error::{hf, Result, TokenizerError};
use crate::vocab::{TokenType, Vocab, VocabKind};

/// The pre-tokenizer split a `tokenizer.ggml.pre` value names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreSplit {
    /// GPT-2's regex (ByteLevel with `use_regex`).
    Gpt2,
    /// Llama 3: one regex with 1-3 digit groups; BPE ignores merges for whole-vocab words.
    Llama3,
    /// Llama 3's regex with every word merged (DBRX, Smaug), as llama.cpp
    /// runs those types.
    Llama3Split,
    /// Qwen2: Llama 3's regex with single digits, NFC normalization.
    Qwen2,
    /// Qwen2's regex without NFC, as llama.cpp runs it for the other models
    /// of its type (StableLM 2, Hunyuan, Solar Open, ...).
    Qwen2Split,
    /// Qwen3.5: Qwen2's, with combining marks (\p{M}) inside words.
    Qwen35,
    /// GPT-4o's o200k split (Llama 4, MiniMax-M2, ...): words by case,
    /// contractions attached, 1-3 digit groups.
    Gpt4o,
    /// Mistral's Tekken: o200k's word split, single digits, no
    /// contractions; whole-vocabulary words skip the merges.
    Tekken,
    /// Single digits, then GPT-2's regex (StarCoder, Refact, Command-R, SmolLM).
    DigitsGpt2,
    /// Falcon: punctuation runs, GPT-2's regex, digit runs, triples of digits.
    Falcon,
    DeepseekCoder,
    DeepseekLlm,
    /// llama.cpp's default BPE split.
    Default,
}

const LLAMA3_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_RE: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN_RE: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT2_RE: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const CJK_RE: &str = "[一-龥ࠀ-一가-퟿]+";
// The letters of deepseek-llm's tokenizer.json. Six of its characters are
// written as escapes: NFC (which an editor may apply to the source) maps
// them to other code points and turns their ranges inside out.
const DEEPSEEK_LLM_LETTERS: &str = r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\x{1F7D}ᾀ-ᾴᾶ-ᾼ\x{1FBE}ῂ-ῄῆ-ῌῐ-\x{1FD3}ῖ-\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\x{2126}ℨ\x{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";
const DEEPSEEK_LLM_PUNCT: &str = r"\s?[!-/:-~！-／：-～‘-‟　-。]+";

impl PreSplit {
    /// The split for a `tokenizer.ggml.pre` value, or `None` if unknown.
    pub fn from_pre(pre: &str) -> Option<Self> {
        Some(match pre {
            "default" => PreSplit::Default,
            // Grouped as llama.cpp's llama-vocab.cpp groups them: each name
            // by its pre type, each type by the split it runs
            // (tests/llamacpp_vocab.rs checks the table against that file).
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" => PreSplit::Llama3,
            "dbrx" | "smaug-bpe" => PreSplit::Llama3Split,
            "qwen2" | "qwen2.5" | "qwen-2.5" | "deepseek-r1-qwen" => PreSplit::Qwen2,
            "kormo" | "f2llmv2" | "megrez" | "stablelm2" | "hunyuan" | "solar-open" => {
                PreSplit::Qwen2Split
            }
            "qwen35" => PreSplit::Qwen35,
            "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => PreSplit::Gpt4o,
            "tekken" => PreSplit::Tekken,
            "gpt-2" | "gpt2" | "mpt" | "olmo" | "jais" | "phi-2" | "jina-es" | "jina-de"
            | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert"
            | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "exaone4" | "trillion"
            | "granite-docling" => PreSplit::Gpt2,
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone"
            | "minerva-7b" | "mellum2" => PreSplit::DigitsGpt2,
            "falcon" => PreSplit::Falcon,
            "deepseek-coder" => PreSplit::DeepseekCoder,
            "deepseek-llm" => PreSplit::DeepseekLlm,
            _ => return None,
        })
    }
}

fn split(re: &str) -> Result<PreTokenizerWrapper> {
    let pattern = SplitPattern::Regex(re.to_string());
    Ok(Split::new(pattern, SplitDelimiterBehavior::Isolated, false)
        .map_err(hf)?
        .into())
}

fn byte_level(use_regex: bool) -> PreTokenizerWrapper {
    ByteLevel::new(false, true, use_regex).into()
}

fn pre_tokenizer(split_kind: PreSplit) -> Result<PreTokenizerWrapper> {
    let seq: Vec<PreTokenizerWrapper> = match split_kind {
        PreSplit::Gpt2 => vec![byte_level(true)],
        PreSplit::Llama3 | PreSplit::Llama3Split => vec![split(LLAMA3_RE)?, byte_level(false)],
        PreSplit::Qwen2 | PreSplit::Qwen2Split => vec![split(QWEN2_RE)?, byte_level(false)],
        PreSplit::Qwen35 => vec![split(QWEN35_RE)?, byte_level(false)],
        PreSplit::Gpt4o => vec![split(GPT4O_RE)?, byte_level(false)],
        PreSplit::Tekken => vec![split(TEKKEN_RE)?, byte_level(false)],
        PreSplit::DigitsGpt2 => vec![Digits::new(true).into(), byte_level(true)],
        PreSplit::Falcon => vec![
            Punctuation::new(SplitDelimiterBehavior::Contiguous).into(),
            byte_level(true),
            Digits::new(false).into(),
            split("[0-9][0-9][0-9]")?,
        ],
        PreSplit::DeepseekCoder => vec![
            split(r"[\r\n]")?,
            split(r"\s?\p{L}+")?,
            split(r"\s?\p{P}+")?,
            split(CJK_RE)?,
            Digits::new(true).into(),
            byte_level(false),
        ],
        PreSplit::DeepseekLlm => vec![
            split(r"[\r\n]")?,
            split(DEEPSEEK_LLM_LETTERS)?,
            split(DEEPSEEK_LLM_PUNCT)?,
            split(r"\s+$")?,
            split(CJK_RE)?,
            Digits::new(false).into(),
            byte_level(false),
        ],
        PreSplit::Default => vec![
            split(r"[\p{P}\$\+<=>\^~\|]+")?,
            split(GPT2_RE)?,
            Digits::new(false).into(),
            split("[0-9][0-9][0-9]")?,
            byte_level(false),
        ],
    };
    Ok(PreSequence::new(seq).into())
}

/// SentencePiece merges from scores, as transformers' `SentencePieceExtractor`
/// derives them: every split of every piece into two pieces of the
/// vocabulary, ordered by the merged piece's score (higher first), ties by id.
fn spm_merges(
    tokens: &[String],
    scores: &[f32],
    index: &HashMap<&str, u32>,
) -> Vec<(String, String)> {
    let mut merges: Vec<(u32, u32, f32)> = Vec::new();
    for (piece, &score) in tokens.iter().zip(scores) {
        let mut local = Vec::new();
        for (i, _) in piece.char_indices().skip(1) {
            if let (Some(&l), Some(&r)) = (index.get(&piece[..i]), index.get(&piece[i..])) {
                local.push((l, r, score));
            }
        }
        local.sort_by_key(|&(l, r, _)| (l, r));
        merges.extend(local);
    }
    // Stable sort: equal scores keep vocabulary order.
    merges.sort_by(|a, b| b.2.total_cmp(&a.2));
    merges
        .into_iter()
        .map(|(l, r, _)| (tokens[l as usize].clone(), tokens[r as usize].clone()))
        .collect()
}

fn bpe_merges(merges: &[String]) -> Result<Vec<(String, String)>> {
    merges
        .iter()
        .map(|m| {
            // The separator is the first space after the first character
            // (a merge's left side may itself start with a space-like byte).
            let first = m.chars().next().map_or(0, char::len_utf8);
            match m[first..].find(' ') {
                Some(p) => Ok((m[..first + p].to_string(), m[first + p + 1..].to_string())),
                None => Err(TokenizerError::BadVocab(format!(
                    "merge `{m}` has no space"
                ))),
            }
        })
        .collect()
}

/// Build the HF tokenizer for `vocab`. Returns it and the split in use.
pub fn build(vocab: &Vocab) -> Result<(Tokenizer, Option<PreSplit>)> {
    let mut index: HashMap<&str, u32> = HashMap::with_capacity(vocab.tokens.len());
    for (i, t) in vocab.tokens.iter().enumerate() {
        // llama.cpp keeps the last id for duplicate strings; HF needs unique keys.
        index.insert(t.as_str(), i as u32);
    }
    let hf_vocab: tokenizers::models::bpe::Vocab =
        index.iter().map(|(k, &v)| (k.to_string(), v)).collect();
    let (tokenizer, split_kind) = match vocab.kind {
        VocabKind::Spm | VocabKind::SpmBpe => {
            let merges = match vocab.kind {
                VocabKind::Spm => spm_merges(&vocab.tokens, &vocab.scores, &index),
                _ => bpe_merges(&vocab.merges)?,
            };
            let mut b = BPE::builder()
                .vocab_and_merges(hf_vocab, merges)
                .byte_fallback(true)
                .fuse_unk(true);
            if let Some(unk) = vocab.unk {
                b = b.unk_token(vocab.tokens[unk as usize].clone());
            }
            let mut t = Tokenizer::new(b.build().map_err(hf)?);
            let mut norms: Vec<NormalizerWrapper> = Vec::new();
            if vocab.add_space_prefix {
                norms.push(Prepend::new("▁".into()).into());
            }
            norms.push(Replace::new(" ", "▁").map_err(hf)?.into());
            t.with_normalizer(Some(NormalizerSequence::new(norms)));
            if vocab.kind == VocabKind::SpmBpe {
                // llama.cpp splits gemma4's text only into runs of newlines
                // and runs of everything else.
                t.with_pre_tokenizer(Some(split(r"[^\n]+|[\n]+")?));
            }
            // Decoding is ours (Tokenizer::spm_decode), as llama.cpp does it.
            (t, None)
        }
        VocabKind::Wpm => {
            // Back to BERT's spelling: `▁x` starts a word (`x`), a bare `x`
            // continues one (`##x`), `[CLS]`-style names stay.
            let wp_vocab: tokenizers::models::bpe::Vocab = index
                .iter()
                .map(|(&t, &i)| {
                    let piece = match t.strip_prefix('▁') {
                        Some(word) => word.to_string(),
                        None if t.starts_with('[') && t.ends_with(']') => t.to_string(),
                        None => format!("##{t}"),
                    };
                    (piece, i)
                })
                .collect();
            let unk = vocab
                .unk
                .map_or("[UNK]".to_string(), |u| vocab.tokens[u as usize].clone());
            let model = WordPiece::builder()
                .vocab(wp_vocab)
                .unk_token(unk)
                .build()
                .map_err(hf)?;
            let mut t = Tokenizer::new(model);
            // Uncased, as llama.cpp's WPM always lowercases.
            t.with_normalizer(Some(BertNormalizer::new(true, true, None, true)));
            t.with_pre_tokenizer(Some(BertPreTokenizer));
            t.with_decoder(Some(WordPieceDecoder::default()));
            (t, None)
        }
        VocabKind::Bpe => {
            let pre = vocab.pre.as_deref().unwrap_or("default");
            let split_kind = PreSplit::from_pre(pre).unwrap_or_else(|| {
                tracing::warn!(
                    "unknown tokenizer.ggml.pre `{pre}`: using GPT-2's pre-tokenizer split"
                );
                PreSplit::Gpt2
            });
            let merges = bpe_merges(&vocab.merges)?;
            let b = BPE::builder()
                .vocab_and_merges(hf_vocab, merges)
                .ignore_merges(matches!(split_kind, PreSplit::Llama3 | PreSplit::Tekken));
            let mut t = Tokenizer::new(b.build().map_err(hf)?);
            if split_kind == PreSplit::Qwen2 {
                t.with_normalizer(Some(NFC));
            }
            t.with_pre_tokenizer(Some(pre_tokenizer(split_kind)?));
            t.with_decoder(Some(ByteLevelDecoder::default()));
            (t, Some(split_kind))
        }
    };
    let mut tokenizer = tokenizer;
    // Control and user-defined tokens are matched whole in the input (control
    // ones only when special-token parsing is on).
    let of_type = |want: &[TokenType], special: bool| -> Vec<AddedToken> {
        vocab
            .tokens
            .iter()
            .zip(&vocab.types)
            .filter(|(_, ty)| want.contains(ty))
            .map(|(t, _)| AddedToken::from(t.clone(), special).normalized(false))
            .collect()
    };
    tokenizer.add_special_tokens(&of_type(&[TokenType::Control, TokenType::Unknown], true));
    tokenizer.add_tokens(&of_type(&[TokenType::UserDefined], false));
    Ok((tokenizer, split_kind))
}
