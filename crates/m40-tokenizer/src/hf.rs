//! Build a Hugging Face `tokenizers` pipeline from a GGUF vocabulary, the way
//! transformers' converters build `tokenizer.json` for the same models.

use std::collections::HashMap;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::bert::BertNormalizer;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence, NFC};
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::{AddedToken, Tokenizer};

use crate::error::{hf, Result, TokenizerError};
use crate::pre::{pre_tokenizer, PreSplit};
use crate::vocab::{TokenType, Vocab, VocabKind};

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
            // Raw UTF-8 BPE (gemma4's kind) splits as its pre says: runs of
            // newlines and of the rest, or `whitespace`'s runs of
            // non-whitespace, which alone keeps its spaces.
            let raw_split = (vocab.kind == VocabKind::SpmBpe).then(|| {
                vocab
                    .pre
                    .as_deref()
                    .and_then(PreSplit::from_pre)
                    .filter(|s| !s.byte_level())
                    .unwrap_or(PreSplit::SpmStyle)
            });
            if raw_split != Some(PreSplit::Whitespace) {
                norms.push(Replace::new(" ", "▁").map_err(hf)?.into());
            }
            if !norms.is_empty() {
                t.with_normalizer(Some(NormalizerSequence::new(norms)));
            }
            if let Some(raw) = raw_split {
                t.with_pre_tokenizer(Some(pre_tokenizer(raw)?));
            }
            // Decoding is ours (Tokenizer::spm_decode), as llama.cpp does it.
            (t, raw_split)
        }
        VocabKind::Ugm => {
            // Segmentation is ours (ugm.rs, as llama.cpp does it); this
            // model only names the tokens and splits off the special ones.
            let unk = vocab
                .unk
                .map_or("<unk>".to_string(), |u| vocab.tokens[u as usize].clone());
            let model = WordLevel::builder()
                .vocab(hf_vocab)
                .unk_token(unk)
                .build()
                .map_err(hf)?;
            (Tokenizer::new(model), None)
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
                .ignore_merges(split_kind.ignores_merges());
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
