//! m40-chat: what a chat API asks of the shape of an answer. Today the
//! structured outputs (`constraint`: JSON mode, JSON schemas, GBNF, Lark
//! and regex grammars through llguidance, with a token mask per step);
//! the model families' tool-call and thinking formats belong here too.

pub mod constraint;
mod gbnf;

pub use constraint::{Constraint, Format, FormatError, Grammars, TokenMask};
pub use gbnf::to_lark as gbnf_to_lark;
