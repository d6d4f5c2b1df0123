//! The bytes each token stands for, as a constraint engine needs them: the
//! text a token adds when it is decoded, byte for byte (a byte token's one
//! byte, not U+FFFD), with control tokens set apart.

use crate::vocab::{byte_token_value, TokenType, VocabKind};
use crate::Tokenizer;

/// What one token decodes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenBytes {
    /// Text: these bytes (possibly part of a UTF-8 character).
    Text(Vec<u8>),
    /// A control, unknown or unused token: no text (its piece names it).
    Special,
}

/// GPT-2's byte-level alphabet, reversed: the byte each of the 256
/// characters a byte-level BPE piece is written in stands for (printable
/// Latin-1 for itself, the others shifted to U+0100 on).
fn byte_level_value(c: char) -> Option<u8> {
    let c = c as u32;
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    if c < 256 && printable(c) {
        return Some(c as u8);
    }
    // The others, in byte order, are U+0100, U+0101, ...
    let n = c.checked_sub(256)?;
    (0u32..256)
        .filter(|&b| !printable(b))
        .nth(n as usize)
        .map(|b| b as u8)
}

impl Tokenizer {
    /// The bytes token `id` adds to decoded text ([`TokenBytes::Special`]
    /// for control tokens, which [`Tokenizer::decode`] leaves out). A
    /// SentencePiece vocabulary's `▁` is a space here, also at the start
    /// (decoding drops the one space the encoder prepends; a continuation
    /// keeps it). None for an id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<TokenBytes> {
        let piece = self.vocab.tokens.get(id as usize)?;
        let ty = self.vocab.types[id as usize];
        if matches!(
            ty,
            TokenType::Control | TokenType::Unknown | TokenType::Unused
        ) {
            return Some(TokenBytes::Special);
        }
        let bytes = match self.vocab.kind {
            VocabKind::Spm | VocabKind::SpmBpe | VocabKind::Ugm => match ty {
                TokenType::Byte => match byte_token_value(piece) {
                    Some(b) => vec![b],
                    None => piece.as_bytes().to_vec(),
                },
                _ => piece.replace('▁', " ").into_bytes(),
            },
            VocabKind::Bpe if ty == TokenType::Normal => {
                let mapped: Option<Vec<u8>> = piece.chars().map(byte_level_value).collect();
                // A piece outside the alphabet is its own text.
                mapped.unwrap_or_else(|| piece.as_bytes().to_vec())
            }
            VocabKind::Bpe => piece.as_bytes().to_vec(),
            VocabKind::Wpm => match piece.strip_prefix('▁') {
                Some(word) => format!(" {word}").into_bytes(),
                None => piece.as_bytes().to_vec(),
            },
        };
        Some(TokenBytes::Text(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::byte_level_value;

    #[test]
    fn the_byte_level_alphabet_is_a_bijection() {
        let mut seen = [false; 256];
        for c in (0u32..0x200).filter_map(char::from_u32) {
            if let Some(b) = byte_level_value(c) {
                assert!(!seen[b as usize], "{c:?} maps to a byte already taken");
                seen[b as usize] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(byte_level_value('Ġ'), Some(b' '));
        assert_eq!(byte_level_value('Ċ'), Some(b'\n'));
        assert_eq!(byte_level_value('a'), Some(b'a'));
    }
}
