//! m40-chat: what a chat API asks of the shape of an answer and finds in
//! it: structured outputs (`constraint`: JSON mode, JSON schemas, GBNF,
//! Lark and regex grammars through llguidance, with a token mask per
//! step), tool definitions and each model family's call syntax (`tools`),
//! and the parser that separates content, thinking and calls (`output`).

pub mod constraint;
mod gbnf;
pub mod output;
pub mod tools;

pub use constraint::{Constraint, Format, FormatError, Grammars, TokenMask};
pub use gbnf::to_lark as gbnf_to_lark;
pub use m40_tokenizer::ToolCall;
pub use output::{OutputParser, Parsed, Thinking};
pub use tools::{Syntax, Tool, ToolChoice, ToolError};
