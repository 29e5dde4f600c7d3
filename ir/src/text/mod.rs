//! kiln's text form of a graph: stable, readable, and parseable back.
//!
//! ```text
//! graph cifarnet {
//!   input %x: f32[4,3,32,32]
//!   %conv1.weight: f32[6,3,5,5] = Constant <elided: 450 values in [-0.1151, 0.1153], digest 9f86d081884c7d65>
//!   %shape: i64[2] = Constant [4, 400]
//!   %conv: f32[4,6,28,28] = Conv(%x, %conv1.weight, %conv1.bias) {auto_pad = "NOTSET", ..., group = 1}
//!   %parts: (f32[2,8], f32[2,8]) = Split(%h) {axis = 1, num_outputs = 2}
//!   %y: f32[2,8] = Add(%parts, %parts#1)
//!   output %logits = %fc3
//! }
//! ```
//!
//! Values are `%name` (a node's first result) or `%name#i`; `_` is an omitted optional operand.
//! Names that are not plain (letters, digits, `_ . - /`) are quoted. Constants of up to
//! [`INLINE_LIMIT`] elements print their values; larger ones print a summary, or their bytes in hex
//! with [`Weights::Full`]. Only the full form parses back, so `print(Full) -> parse -> print(Full)`
//! is the identity.

mod parse;
mod print;

pub use parse::parse;
pub use print::{print, tensor_data, tensor_literal};

/// Constants with at most this many elements always print their values.
pub const INLINE_LIMIT: usize = 16;

/// How large constants print.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Weights {
    /// A one-line summary (type, count, range, digest). Does not parse back.
    #[default]
    Summary,
    /// Every byte, in hex. Parses back exactly.
    Full,
}

/// True when a name prints without quotes.
pub(crate) fn is_bare_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/'))
}

pub(crate) fn name_literal(s: &str) -> String {
    if is_bare_name(s) {
        s.to_string()
    } else {
        format!("{s:?}")
    }
}

impl std::fmt::Display for crate::Graph {
    /// The text form with large weights summarised.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&print(self, Weights::Summary))
    }
}
