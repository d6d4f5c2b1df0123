//! Streaming detokenization: text is emitted only when it is whole UTF-8, and
//! the concatenation of everything emitted (plus [`StreamDecoder::finish`])
//! equals decoding all ids at once.
//!
//! The decoder keeps a window of ids: `prefix` is the text the window's first
//! part decodes to; a new id is decoded together with the window and whatever
//! the result adds past `prefix` is emitted, unless it ends in an incomplete
//! UTF-8 sequence (U+FFFD). Decoding within a window, rather than each token
//! alone, is what keeps SentencePiece's leading-space rules and multi-token
//! characters right.

use std::ops::Deref;

use crate::error::Result;
use crate::Tokenizer;

/// A streaming decoder over a tokenizer it borrows (`Tokenizer::stream`)
/// or owns a handle to (`StreamDecoder::new(Arc<..>, ..)`: a decoder that
/// outlives the borrow, as a running generation does).
pub struct StreamDecoder<T: Deref<Target = Tokenizer>> {
    tok: T,
    ids: Vec<u32>,
    /// Window start: ids before it have been emitted and are forgotten.
    start: usize,
    /// Ids `start..read` decode to `prefix`, already emitted.
    read: usize,
    prefix: String,
    /// Control tokens written out.
    special: bool,
}

impl<T: Deref<Target = Tokenizer>> StreamDecoder<T> {
    /// A decoder over `tok`; `special`: control tokens written out.
    pub fn new(tok: T, special: bool) -> Self {
        Self {
            tok,
            ids: Vec::new(),
            start: 0,
            read: 0,
            prefix: String::new(),
            special,
        }
    }

    /// The tokenizer it decodes with.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        if self.special {
            self.tok.decode_with_special(ids)
        } else {
            self.tok.decode(ids)
        }
    }

    /// Feed one id; returns the text that became complete (often empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.tok.check(&[id])?;
        self.ids.push(id);
        let text = self.decode(&self.ids[self.start..])?;
        if text.ends_with('\u{FFFD}')
            || text.len() <= self.prefix.len()
            || !text.starts_with(self.prefix.as_str())
        {
            // Incomplete character, nothing new, or a rewrite of the window's
            // text: wait for more ids.
            if !text.starts_with(self.prefix.as_str()) && !text.ends_with('\u{FFFD}') {
                return self.resync(text);
            }
            return Ok(String::new());
        }
        let delta = text[self.prefix.len()..].to_string();
        self.advance()?;
        Ok(delta)
    }

    /// Move the window so it holds only the ids decoded last.
    fn advance(&mut self) -> Result<()> {
        self.start = self.read;
        self.read = self.ids.len();
        self.prefix = self.decode(&self.ids[self.start..self.read])?;
        // Drop ids that can no longer affect the output.
        if self.start > 64 {
            self.ids.drain(..self.start);
            self.read -= self.start;
            self.start = 0;
        }
        Ok(())
    }

    /// The window decodes to text that does not extend what was emitted (a
    /// decoder rule changed an earlier character): emit from the first
    /// difference so nothing is lost; this is rare and only reachable with
    /// decoders that rewrite context.
    fn resync(&mut self, text: String) -> Result<String> {
        let common = self
            .prefix
            .char_indices()
            .zip(text.chars())
            .take_while(|((_, a), b)| a == b)
            .count();
        let at = text
            .char_indices()
            .nth(common)
            .map_or(text.len(), |(i, _)| i);
        let delta = text[at..].to_string();
        self.advance()?;
        Ok(delta)
    }

    /// Whatever is held back (an incomplete character at the end of the
    /// stream, written as U+FFFD as a full decode would), and reset.
    pub fn finish(&mut self) -> Result<String> {
        let text = self.decode(&self.ids[self.start..])?;
        let delta = text
            .get(self.prefix.len()..)
            .unwrap_or_default()
            .to_string();
        self.ids.clear();
        self.start = 0;
        self.read = 0;
        self.prefix.clear();
        Ok(delta)
    }
}
