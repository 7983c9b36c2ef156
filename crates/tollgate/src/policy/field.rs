//! What a name in a policy may be: how long, and which characters it may not hold.

/// Longest domain or key, in bytes. A value may be longer: in counter keys it is replaced by
/// a digest of it (see `limiter::keys`).
pub const MAX_FIELD_LEN: usize = 1024;

/// The Unicode characters that reorder text around them (marks, embeddings, overrides,
/// isolates): in a name they could make a log line or a terminal read otherwise than it is.
pub(crate) fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Whether `text` holds a control character or a bidirectional one: written to a log line, a
/// metric label or a terminal, it could forge a line or hide what it says.
pub(crate) fn garbles(text: &str) -> bool {
    text.chars().any(|c| c.is_control() || is_bidi_control(c))
}
