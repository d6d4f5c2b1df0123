//! Unigram (SentencePiece's UGM, GGUF's `t5` tokenizer model) as llama.cpp
//! runs it: the precompiled character map and whitespace rules normalize
//! the text, then the best-scoring segmentation over the vocabulary
//! (SentencePiece's Viterbi), unknown code points as one fused unknown token.

use std::collections::HashMap;

use crate::error::{Result, TokenizerError};
use crate::vocab::{TokenType, Vocab};

/// SentencePiece's escaped space (U+2581).
const ESCAPED_SPACE: &str = "▁";
/// An unknown code point scores this far below the worst normal token.
const UNKNOWN_PENALTY: f32 = 10.0;

/// SentencePiece's precompiled character map: a trie of input prefixes in an
/// XOR-compressed compact double array (XCDA), each leaf the offset of its
/// NUL-terminated replacement.
struct CharsMap {
    xcda: Vec<u32>,
    replacements: Vec<u8>,
}

impl CharsMap {
    fn parse(blob: &[u8]) -> Result<Self> {
        let bad = |what: &str| TokenizerError::BadVocab(format!("precompiled_charsmap: {what}"));
        if blob.len() < 4 {
            return Err(bad("shorter than its header"));
        }
        let n = u32::from_le_bytes(blob[..4].try_into().unwrap()) as usize;
        if !n.is_multiple_of(4) || 4 + n >= blob.len() {
            return Err(bad(&format!("array of {n} bytes in {} bytes", blob.len())));
        }
        let xcda = blob[4..4 + n]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        Ok(Self {
            xcda,
            replacements: blob[4 + n..].to_vec(),
        })
    }

    fn node(&self, i: usize) -> Result<u32> {
        self.xcda.get(i).copied().ok_or_else(|| {
            TokenizerError::BadVocab(format!("precompiled_charsmap: node {i} out of range"))
        })
    }

    fn base(node: u32) -> u32 {
        (node >> 10) << ((node & (1 << 9)) >> 6)
    }

    /// The longest prefix of `input` the map replaces: its length and the
    /// replacement.
    fn longest(&self, input: &[u8]) -> Result<Option<(usize, &[u8])>> {
        let mut found = None;
        let mut at = Self::base(self.node(0)?) as usize;
        for (i, &c) in input.iter().enumerate() {
            if c == 0 {
                break;
            }
            at ^= c as usize;
            let node = self.node(at)?;
            // LCHECK (with the value flag, bit 31): the child for `c`?
            if node & ((1 << 31) | 0xff) != c as u32 {
                break;
            }
            let leaf = (node >> 8) & 1 == 1;
            at ^= Self::base(node) as usize;
            if leaf {
                let value = (self.node(at)? & ((1 << 31) - 1)) as usize;
                found = Some((i + 1, value));
            }
        }
        let Some((len, offset)) = found else {
            return Ok(None);
        };
        let rest = self.replacements.get(offset..).unwrap_or_default();
        match rest.iter().position(|&b| b == 0) {
            Some(end) => Ok(Some((len, &rest[..end]))),
            None => Err(TokenizerError::BadVocab(
                "precompiled_charsmap: replacement without its NUL".into(),
            )),
        }
    }
}

/// A Unigram vocabulary ready to segment text.
pub(crate) struct Ugm {
    charsmap: Option<CharsMap>,
    /// Normal, user-defined and unused tokens by their bytes.
    pieces: HashMap<Vec<u8>, u32>,
    max_piece: usize,
    /// User-defined tokens pass normalization untouched (longest first).
    user_defined: Vec<Vec<u8>>,
    scores: Vec<f64>,
    unk: u32,
    unk_score: f64,
    add_space_prefix: bool,
    remove_extra_whitespaces: bool,
}

impl Ugm {
    pub(crate) fn new(vocab: &Vocab) -> Result<Self> {
        let unk = vocab.unk.ok_or_else(|| {
            TokenizerError::BadVocab("a t5 (Unigram) tokenizer needs an unknown token".into())
        })?;
        let charsmap = match &vocab.precompiled_charsmap {
            Some(blob) if !blob.is_empty() => Some(CharsMap::parse(blob)?),
            _ => None,
        };
        let mut pieces = HashMap::with_capacity(vocab.tokens.len());
        let mut user_defined = Vec::new();
        let mut min_score = f32::MAX;
        let mut scores = Vec::with_capacity(vocab.tokens.len());
        for (i, ((t, &ty), &score)) in vocab
            .tokens
            .iter()
            .zip(&vocab.types)
            .zip(&vocab.scores)
            .enumerate()
        {
            if ty == TokenType::Normal {
                min_score = min_score.min(score);
            }
            if matches!(
                ty,
                TokenType::Normal | TokenType::UserDefined | TokenType::Unused
            ) {
                pieces.insert(t.as_bytes().to_vec(), i as u32);
            }
            // User-defined tokens score 0, above every log probability.
            if ty == TokenType::UserDefined {
                user_defined.push(t.as_bytes().to_vec());
                scores.push(0.0);
            } else {
                scores.push(score as f64);
            }
        }
        user_defined.sort_by_key(|u| std::cmp::Reverse(u.len()));
        Ok(Self {
            charsmap,
            max_piece: pieces.keys().map(Vec::len).max().unwrap_or(1),
            pieces,
            user_defined,
            scores,
            unk,
            unk_score: (min_score - UNKNOWN_PENALTY) as f64,
            add_space_prefix: vocab.add_space_prefix,
            remove_extra_whitespaces: vocab.remove_extra_whitespaces,
        })
    }

    /// The normalized form of one prefix of `input`: (bytes, consumed).
    fn normalize_prefix<'a>(&'a self, input: &'a str) -> Result<(&'a [u8], usize)> {
        let bytes = input.as_bytes();
        if let Some(u) = self.user_defined.iter().find(|u| bytes.starts_with(u)) {
            return Ok((u, u.len()));
        }
        if let Some(map) = &self.charsmap {
            if let Some((len, repl)) = map.longest(bytes)? {
                return Ok((repl, len));
            }
        }
        let n = input.chars().next().map_or(1, char::len_utf8);
        Ok((&bytes[..n], n))
    }

    /// llama.cpp's normalization: mapped prefixes, spaces as `▁`, a space
    /// before the text (add_space_prefix) or, with extra whitespace
    /// removed, one space before every word and none elsewhere.
    fn normalize(&self, input: &str) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(input.len() * 3);
        let space = ESCAPED_SPACE.as_bytes();
        let merge = self.remove_extra_whitespaces;
        let (mut prepended, mut in_word) = (false, false);
        let mut at = 0;
        while at < input.len() {
            let (norm, used) = self.normalize_prefix(&input[at..])?;
            for &c in norm {
                if c != b' ' {
                    if !in_word {
                        in_word = true;
                        if (self.add_space_prefix && !prepended) || merge {
                            out.extend_from_slice(space);
                            prepended = true;
                        }
                    }
                    out.push(c);
                } else {
                    in_word = false;
                    if !merge {
                        out.extend_from_slice(space);
                    }
                }
            }
            at += used;
        }
        Ok(out)
    }

    /// Token ids of one fragment of text (no special tokens in it).
    pub(crate) fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let norm = self.normalize(text)?;
        let n = norm.len();
        if n == 0 {
            return Ok(());
        }
        // The best segmentation of norm[..i]: (token, start, score).
        let mut best: Vec<(u32, usize, f64)> = vec![(self.unk, 0, f64::MIN); n + 1];
        best[0].2 = 0.0;
        let mut at = 0;
        while at < n {
            let width = utf8_width(norm[at]).min(n - at);
            let here = best[at].2;
            let mut whole_char = false;
            for end in at + 1..=(at + self.max_piece).min(n) {
                let Some(&id) = self.pieces.get(&norm[at..end]) else {
                    continue;
                };
                whole_char |= end - at == width;
                let score = here + self.scores[id as usize];
                if score > best[end].2 {
                    best[end] = (id, at, score);
                }
            }
            if !whole_char {
                let score = here + self.unk_score;
                if score > best[at + width].2 {
                    best[at + width] = (self.unk, at, score);
                }
            }
            at += width;
        }
        // Back from the end; a run of unknowns is one unknown token.
        let first = out.len();
        let (mut end, mut prev_unknown) = (n, false);
        loop {
            let (id, start, _) = best[end];
            let unknown = id == self.unk;
            if !(prev_unknown && unknown) {
                out.push(id);
            }
            if start == 0 {
                break;
            }
            prev_unknown = unknown;
            end = start;
        }
        out[first..].reverse();
        Ok(())
    }
}

/// The length of the UTF-8 sequence a lead byte starts (1 for a stray
/// continuation byte).
fn utf8_width(lead: u8) -> usize {
    match lead {
        0xf0..=0xff => 4,
        0xe0..=0xef => 3,
        0xc0..=0xdf => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::VocabKind;

    fn vocab(pieces: &[(&str, f32, TokenType)], merge: bool, prefix: bool) -> Vocab {
        Vocab {
            kind: VocabKind::Ugm,
            pre: None,
            tokens: pieces.iter().map(|p| p.0.to_string()).collect(),
            scores: pieces.iter().map(|p| p.1).collect(),
            types: pieces.iter().map(|p| p.2).collect(),
            merges: vec![],
            bos: None,
            eos: None,
            eot: None,
            eom: None,
            unk: Some(0),
            pad: None,
            add_bos: false,
            add_eos: false,
            sep: None,
            add_sep: false,
            lowercase: false,
            strip_accents: false,
            add_space_prefix: prefix,
            remove_extra_whitespaces: merge,
            precompiled_charsmap: None,
            chat_template: None,
        }
    }

    fn encode(v: &Vocab, text: &str) -> Vec<u32> {
        let mut out = vec![];
        Ugm::new(v).unwrap().encode(text, &mut out).unwrap();
        out
    }

    #[test]
    fn best_segmentation_unknown_runs_and_spaces() {
        use TokenType::*;
        let v = vocab(
            &[
                ("<unk>", 0.0, Unknown),
                ("▁a", -1.0, Normal),
                ("b", -1.0, Normal),
                ("▁ab", -3.0, Normal),
                ("▁", -2.0, Normal),
                ("c", -1.5, Normal),
                ("bc", -0.5, Normal),
                ("<x>", -100.0, UserDefined),
            ],
            false,
            true,
        );
        // ▁a + bc (-1.5) beats ▁ab + c (-4.5) and ▁a + b + c (-3.5).
        assert_eq!(encode(&v, "abc"), [1, 6]);
        // Two unknown characters are one unknown token; spaces are kept.
        assert_eq!(encode(&v, "a zz"), [1, 4, 0]);
        // A user-defined token scores 0, so it wins over its pieces.
        assert_eq!(encode(&v, "a<x>"), [1, 7]);
        // Extra whitespace removed: one space before each word.
        let merged = vocab(&v_pieces(&v), true, false);
        assert_eq!(encode(&merged, "  a   a "), [1, 1]);
        assert!(encode(&merged, "   ").is_empty());
    }

    fn v_pieces(v: &Vocab) -> Vec<(&str, f32, TokenType)> {
        (0..v.tokens.len())
            .map(|i| (v.tokens[i].as_str(), v.scores[i], v.types[i]))
            .collect()
    }
}
