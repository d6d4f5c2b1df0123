//! WordPiece (`bert` vocabularies) segmented as llama.cpp does, which is not
//! quite BERT's: each code point is first mapped to the first code point of
//! its canonical decomposition (so a Hangul syllable becomes its leading
//! jamo, an accented letter its base), marks (`\p{M}`: spacing ones and
//! enclosing keycaps too), controls and NUL dropped, letters lowercased
//! one code point to one; punctuation, ASCII symbols and CJK ideographs
//! are words of their own; then each word, with a leading `▁`, is taken
//! apart greedily by the longest vocabulary entry, the whole word `[UNK]`
//! where any part is not found. Hugging Face's WordPiece keeps spacing and
//! enclosing marks and decomposes Hangul in full, so Hangul, Devanagari and
//! emoji keycaps came out differently (issue 57).

use std::collections::HashMap;

use unicode_general_category::{get_general_category, GeneralCategory as C};
use unicode_normalization::char::decompose_canonical;

use crate::error::{Result, TokenizerError};
use crate::vocab::Vocab;

pub(crate) struct Wpm {
    ids: HashMap<String, u32>,
    /// The longest entry, in bytes.
    max_len: usize,
    unk: u32,
    lowercase: bool,
    strip_accents: bool,
}

/// The first code point of `c`'s canonical decomposition (llama.cpp's
/// `unicode_cpts_normalize_nfd`, one code point for one).
fn nfd_first(c: char) -> char {
    let mut first = None;
    decompose_canonical(c, |d| {
        first.get_or_insert(d);
    });
    first.unwrap_or(c)
}

fn is_chinese(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        // llama.cpp follows Hugging Face's 0x2B920 here (not 0x2B820).
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

impl Wpm {
    pub(crate) fn new(vocab: &Vocab) -> Result<Self> {
        let unk = vocab
            .unk
            .ok_or_else(|| TokenizerError::BadVocab("a bert vocabulary needs [UNK]".into()))?;
        let ids: HashMap<String, u32> = vocab
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        Ok(Self {
            max_len: vocab.tokens.iter().map(String::len).max().unwrap_or(0),
            ids,
            unk,
            lowercase: vocab.lowercase,
            strip_accents: vocab.strip_accents,
        })
    }

    /// llama.cpp's words of `text` (normalized as the module says).
    fn words(&self, text: &str) -> Vec<String> {
        let mut words = vec![String::new()];
        for c in text.chars() {
            let c = if self.strip_accents { nfd_first(c) } else { c };
            if c.is_whitespace() {
                if !words.last().expect("a word").is_empty() {
                    words.push(String::new());
                }
                continue;
            }
            let cat = get_general_category(c);
            let control = matches!(cat, C::Control | C::Format | C::Surrogate | C::PrivateUse);
            if c == '\0' || c == '\u{FFFD}' || control {
                continue;
            }
            let mark = matches!(cat, C::NonspacingMark | C::SpacingMark | C::EnclosingMark);
            if self.strip_accents && mark {
                continue;
            }
            let c = if self.lowercase {
                c.to_lowercase().next().unwrap_or(c)
            } else {
                c
            };
            let punct = matches!(
                cat,
                C::ConnectorPunctuation
                    | C::DashPunctuation
                    | C::OpenPunctuation
                    | C::ClosePunctuation
                    | C::InitialPunctuation
                    | C::FinalPunctuation
                    | C::OtherPunctuation
            );
            let symbol = matches!(
                cat,
                C::MathSymbol | C::CurrencySymbol | C::ModifierSymbol | C::OtherSymbol
            );
            if punct || (c.is_ascii() && symbol) || is_chinese(c) {
                if !words.last().expect("a word").is_empty() {
                    words.push(String::new());
                }
                words.push(c.to_string());
                words.push(String::new());
            } else {
                words.last_mut().expect("a word").push(c);
            }
        }
        words.retain(|w| !w.is_empty());
        words
    }

    pub(crate) fn encode(&self, text: &str, out: &mut Vec<u32>) {
        for word in self.words(text) {
            let w = format!("\u{2581}{word}");
            let b = w.as_bytes();
            let at = out.len();
            let mut i = 0;
            while i < b.len() {
                let longest = (i + 1..=b.len().min(i + self.max_len)).rev().find_map(|j| {
                    let piece = std::str::from_utf8(&b[i..j]).ok()?;
                    Some((j, *self.ids.get(piece)?))
                });
                match longest {
                    Some((j, id)) => {
                        out.push(id);
                        i = j;
                    }
                    None => {
                        out.truncate(at);
                        break;
                    }
                }
            }
            if out.len() == at {
                out.push(self.unk);
            }
        }
    }
}
