//! A request running in the engine's steps, as an iterator of its tokens
//! ([`Generation`]), and with the `stream` feature as an async `Stream`.
//!
//! The step loop (batcher.rs) sends each sequence's sampled ids over a
//! channel; a `Generation` turns them into [`TokenEvent`]s on the caller's
//! side: detokenized, stop strings held back and cut, thinking and tool
//! calls taken apart, logprobs computed. It waits on the channel itself
//! (no polling), and a cancellation reaches the loop through the
//! sequence's token, which the loop reads before every step.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Instant;

use m40_chat::Parsed;
use m40_tokenizer::{StreamDecoder, Tokenizer};

use crate::batcher::{Core, SeqEvent};
use crate::cancel::CancelToken;
use crate::chat::Reader;
use crate::error::{EngineError, Result};
use crate::prepared::Prepared;
use crate::request::{Completion, FinishReason, Timings, TokenEvent};
use crate::sampling::logprobs;
use crate::stop::StopFilter;

/// The engine's tokenizer, held by a running generation.
pub(crate) struct SharedTokenizer(pub(crate) Arc<Core>);

impl Deref for SharedTokenizer {
    type Target = Tokenizer;
    fn deref(&self) -> &Tokenizer {
        &self.0.tokenizer
    }
}

/// A request running in the engine ([`crate::Engine::start`]): iterate it
/// for its tokens as they are sampled, then [`Generation::finish`] for the
/// [`Completion`]. Dropping it cancels the request (its KV pages are freed
/// at the engine's next step). With the `stream` feature it is also a
/// `futures_core::Stream` of the same events, for async code.
///
/// ```no_run
/// # fn demo(engine: &m40_runtime::Engine) -> Result<(), m40_runtime::EngineError> {
/// use m40_runtime::{Prompt, Request};
/// let prepared = engine.prepare(Request::new(Prompt::Text("Once upon a time".into())))?;
/// let mut run = engine.start(&prepared, &m40_runtime::CancelToken::new());
/// for token in &mut run {
///     print!("{}", token.text);
/// }
/// println!("\n{:?}", run.finish()?.finish_reason);
/// # Ok(()) }
/// ```
pub struct Generation {
    rx: flume::Receiver<SeqEvent>,
    #[cfg(feature = "stream")]
    stream: Option<flume::r#async::RecvStream<'static, SeqEvent>>,
    /// The sequence's own token: cancelled by [`Generation::cancel`], by a
    /// stop string, on drop, or through the caller's token (its parent).
    cancel: CancelToken,
    state: Decode,
    /// The last event (what the decoder and reader still held), once ended.
    tail: Option<TokenEvent>,
    outcome: Option<Result<Completion>>,
}

/// What turns a sequence's ids into events.
struct Decode {
    stream: StreamDecoder<SharedTokenizer>,
    reader: Option<Reader>,
    stops: StopFilter,
    all: Parsed,
    ids: Vec<u32>,
    max_tokens: usize,
    logprobs: Option<usize>,
    ignore_eos: bool,
    /// A stop string ended the text at the last token.
    stopped: bool,
    start: Instant,
    gen_start: Option<Instant>,
    end_token: Option<u32>,
    timings: Timings,
}

/// What one event from the loop amounts to.
enum Turn {
    Token(TokenEvent),
    /// Nothing to show yet (a token whose text is held back still counts).
    Nothing,
    End(Result<FinishReason>),
}

impl Generation {
    pub(crate) fn new(
        core: Arc<Core>,
        prepared: &Prepared,
        rx: flume::Receiver<SeqEvent>,
        cancel: CancelToken,
    ) -> Generation {
        let req = &prepared.request;
        // Thinking and calls are read with control tokens written out.
        let reader = prepared.plan.reader();
        let stream = StreamDecoder::new(SharedTokenizer(core), reader.is_some());
        Generation {
            rx,
            #[cfg(feature = "stream")]
            stream: None,
            cancel,
            state: Decode {
                stream,
                reader,
                stops: StopFilter::new(&req.stop),
                all: Parsed::default(),
                ids: Vec::new(),
                max_tokens: prepared.max_tokens,
                logprobs: req.logprobs,
                ignore_eos: req.ignore_eos,
                stopped: false,
                start: Instant::now(),
                gen_start: None,
                end_token: None,
                timings: Timings {
                    prompt_tokens: prepared.prompt.len(),
                    ..Default::default()
                },
            },
            tail: None,
            outcome: None,
        }
    }

    /// Stop the request: the iteration ends, and [`Generation::finish`]
    /// says [`FinishReason::Cancelled`].
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// A token that cancels this request from another thread.
    pub fn cancel_token(&self) -> CancelToken {
        self.cancel.clone()
    }

    /// The ids generated so far.
    pub fn token_ids(&self) -> &[u32] {
        &self.state.ids
    }

    /// Run to the end (the tokens not yet taken are part of the completion's
    /// text all the same) and return the completion, or why it failed.
    pub fn finish(mut self) -> Result<Completion> {
        while self.next().is_some() {}
        self.outcome.take().unwrap_or(Err(EngineError::Stopped))
    }

    /// Whether a new event must be waited for: None once ended, or the end
    /// found without waiting (the token limit, a cancellation).
    fn before_wait(&mut self) -> Option<Turn> {
        if self.outcome.is_some() {
            return Some(Turn::Nothing);
        }
        if self.state.stopped {
            return Some(Turn::End(Ok(FinishReason::Stop)));
        }
        if self.state.ids.len() >= self.state.max_tokens {
            return Some(Turn::End(Ok(FinishReason::Length)));
        }
        if self.cancel.is_cancelled() {
            return Some(Turn::End(Ok(FinishReason::Cancelled)));
        }
        None
    }

    /// Take a turn: an event shown, nothing, or the end (which sets the
    /// outcome and the tail event).
    fn take(&mut self, turn: Turn) -> Option<TokenEvent> {
        match turn {
            Turn::Token(t) => Some(t),
            Turn::Nothing => None,
            Turn::End(r) => {
                self.cancel.cancel();
                let r = r.and_then(|finish| self.state.end(finish));
                self.outcome = Some(r.map(|(tail, done)| {
                    self.tail = tail;
                    done
                }));
                None
            }
        }
    }

    /// What the channel's state means once it has nothing more.
    fn closed(&self) -> Turn {
        if self.cancel.is_cancelled() {
            Turn::End(Ok(FinishReason::Cancelled))
        } else {
            // The loop ended the sequence: its last allowed token, or a
            // full context.
            Turn::End(Ok(FinishReason::Length))
        }
    }
}

impl Iterator for Generation {
    type Item = TokenEvent;

    /// The next token's event; None once the request has ended (then
    /// [`Generation::finish`] says how).
    fn next(&mut self) -> Option<TokenEvent> {
        loop {
            if self.outcome.is_some() {
                return self.tail.take();
            }
            let turn = match self.before_wait() {
                Some(t) => t,
                None => match self.rx.recv() {
                    Ok(ev) => self.state.on(ev),
                    Err(flume::RecvError::Disconnected) => self.closed(),
                },
            };
            if let Some(t) = self.take(turn) {
                return Some(t);
            }
        }
    }
}

#[cfg(feature = "stream")]
impl Generation {
    /// The next token's event, awaited (the async [`Iterator::next`]: the
    /// `Stream` impl's `next` would be ambiguous beside the iterator's).
    ///
    /// ```no_run
    /// # async fn demo(engine: &m40_runtime::Engine, p: &m40_runtime::Prepared) {
    /// let mut run = engine.start(p, &m40_runtime::CancelToken::new());
    /// while let Some(token) = run.recv().await {
    ///     print!("{}", token.text);
    /// }
    /// # }
    /// ```
    pub async fn recv(&mut self) -> Option<TokenEvent> {
        std::future::poll_fn(|cx| {
            futures_core::Stream::poll_next(std::pin::Pin::new(&mut *self), cx)
        })
        .await
    }
}

#[cfg(feature = "stream")]
impl futures_core::Stream for Generation {
    type Item = TokenEvent;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<TokenEvent>> {
        use std::task::Poll;
        let this = self.get_mut();
        loop {
            if this.outcome.is_some() {
                return Poll::Ready(this.tail.take());
            }
            let turn = match this.before_wait() {
                Some(t) => t,
                None => {
                    let rx = this.rx.clone();
                    let stream = this.stream.get_or_insert_with(|| rx.into_stream());
                    match std::pin::Pin::new(stream).poll_next(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Some(ev)) => this.state.on(ev),
                        Poll::Ready(None) => this.closed(),
                    }
                }
            };
            if let Some(t) = this.take(turn) {
                return Poll::Ready(Some(t));
            }
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl Decode {
    fn read(&mut self, text: String, end: bool) -> Parsed {
        match &mut self.reader {
            Some(r) => {
                let mut p = r.push(&text);
                if end {
                    p.append(r.finish());
                }
                p
            }
            None => Parsed {
                content: text,
                ..Parsed::default()
            },
        }
    }

    /// One event from the loop.
    fn on(&mut self, ev: SeqEvent) -> Turn {
        let (id, raw) = match ev {
            SeqEvent::Token { id, logits } => (id, logits),
            SeqEvent::Failed(e) => return Turn::End(Err(EngineError::Step(e))),
            SeqEvent::Stopped => return Turn::End(Err(EngineError::Stopped)),
            // (Hidden states go only to embeddings' sequences.)
            SeqEvent::Complete | SeqEvent::Hidden(_) => return Turn::End(Ok(FinishReason::Stop)),
        };
        if self.ids.is_empty() {
            self.timings.time_to_first_token_ms = self.start.elapsed().as_secs_f64() * 1e3;
            self.timings.prompt_ms = self.timings.time_to_first_token_ms;
            self.gen_start = Some(Instant::now());
        }
        let tok = self.stream.tokenizer();
        if tok.is_eog(id) && !self.ignore_eos {
            self.end_token = Some(id);
            return Turn::End(Ok(FinishReason::Stop));
        }
        let (logprob, top_logprobs) = match (self.logprobs, raw) {
            (Some(n), Some(raw)) => {
                let (lp, top) = logprobs(&raw, id, n);
                let top = top
                    .into_iter()
                    .map(|(i, l)| (i, tok.piece(i).unwrap_or_default().to_string(), l))
                    .collect();
                (Some(lp), top)
            }
            _ => (None, Vec::new()),
        };
        self.ids.push(id);
        let piece = match self.stream.push(id) {
            Ok(p) => p,
            Err(e) => return Turn::End(Err(e.into())),
        };
        // A stop string: this token's text up to it is shown, then the end.
        let (text, stopped) = self.stops.push(&piece);
        self.stopped = stopped;
        let p = self.read(text, false);
        self.all.append(p.clone());
        Turn::Token(TokenEvent {
            id,
            text: p.content,
            thinking: p.thinking,
            tool_calls: p.calls,
            logprob,
            top_logprobs,
        })
    }

    /// The end: the last event (what the decoder, the stop filter and the
    /// reader still held), if any, and the completion.
    fn end(&mut self, finish: FinishReason) -> Result<(Option<TokenEvent>, Completion)> {
        if self.ids.is_empty() && self.timings.prompt_ms == 0.0 {
            self.timings.prompt_ms = self.start.elapsed().as_secs_f64() * 1e3;
        }
        let tail = if self.stops.stopped {
            String::new()
        } else {
            let mut rest = self.stream.finish()?;
            // An answer cut short may end inside a character: its bytes
            // are dropped, never shown as U+FFFD.
            if finish != FinishReason::Stop {
                let whole = rest.trim_end_matches('\u{FFFD}').len();
                rest.truncate(whole);
            }
            self.stops.finish(&rest)
        };
        let p = self.read(tail, true);
        let event = (!p.is_empty()).then(|| {
            self.all.append(p.clone());
            TokenEvent {
                id: *self.ids.last().unwrap_or(&0),
                text: p.content,
                thinking: p.thinking,
                tool_calls: p.calls,
                logprob: None,
                top_logprobs: Vec::new(),
            }
        });
        self.timings.generated_tokens = self.ids.len();
        self.timings.generation_ms = self
            .gen_start
            .map_or(0.0, |g| g.elapsed().as_secs_f64() * 1e3);
        let all = std::mem::take(&mut self.all);
        Ok((
            event,
            Completion {
                text: all.content,
                thinking: all.thinking,
                tool_calls: all.calls,
                token_ids: self.ids.clone(),
                end_token: self.end_token,
                finish_reason: finish,
                timings: self.timings.clone(),
            },
        ))
    }
}
