//! How a descriptor is shown in top-key listings and per-value counters.

use std::fmt::Write;

use super::request::RequestDescriptor;

/// `descriptor` as top keys and per-value counters show it (see [`describe_entries`]).
pub(super) fn descriptor_text(descriptor: &RequestDescriptor) -> TopKeyText {
    let mut text = TopKeyText::default();
    describe_entries(descriptor, &mut text);
    text
}

/// `key=value,key=value`: how a descriptor is shown in top-key listings. In keys and values,
/// `\`, `,` and `=` are escaped with a `\` and control characters (and the bidirectional
/// formatting ones, which could show a key reversed, and the line and paragraph separators
/// U+2028 and U+2029, which break a line where they are shown) as `\u{..}`, so two descriptors
/// never read the same and a value cannot put escape codes on an operator's terminal.
pub(super) fn describe_entries(descriptor: &RequestDescriptor, out: &mut impl Write) {
    fn escaped(text: &str, out: &mut impl Write) -> std::fmt::Result {
        for c in text.chars() {
            match c {
                '\\' | ',' | '=' => write!(out, "\\{c}")?,
                c if c.is_control() || crate::policy::is_bidi_control(c) || is_separator(c) => {
                    write!(out, "{}", c.escape_unicode())?;
                }
                c => out.write_char(c)?,
            }
        }
        Ok(())
    }
    for (n, (key, value)) in descriptor.entries().iter().enumerate() {
        let written = (if n > 0 { out.write_char(',') } else { Ok(()) })
            .and_then(|()| escaped(key, out))
            .and_then(|()| out.write_char('='))
            .and_then(|()| escaped(value, out));
        if written.is_err() {
            break;
        }
    }
}

/// The line and paragraph separators: not control characters, yet a line ends at them.
fn is_separator(c: char) -> bool {
    matches!(c, '\u{2028}' | '\u{2029}')
}

/// A top-key description on the stack: the top-keys table keeps at most
/// [`MAX_KEY_BYTES`](crate::observe::MAX_KEY_BYTES) bytes of a key, so nothing longer is ever
/// built, and recording a denial allocates nothing unless the key is new to the table.
pub(super) struct TopKeyText {
    bytes: [u8; crate::observe::MAX_KEY_BYTES],
    len: usize,
}

impl Default for TopKeyText {
    fn default() -> Self {
        TopKeyText {
            bytes: [0; crate::observe::MAX_KEY_BYTES],
            len: 0,
        }
    }
}

impl TopKeyText {
    pub fn as_str(&self) -> &str {
        // Only whole chars are ever copied in, so this is always valid UTF-8.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

impl Write for TopKeyText {
    /// Appends whole chars while they fit; errs once the buffer is full (the text is cut at the
    /// last char boundary that fits, as `TopKeys` would cut it).
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        for c in s.chars() {
            let end = self.len + c.len_utf8();
            let Some(slot) = self.bytes.get_mut(self.len..end) else {
                return Err(std::fmt::Error);
            };
            c.encode_utf8(slot);
            self.len = end;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described(entries: &[(&str, &str)]) -> String {
        let entries = entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let descriptor = RequestDescriptor::new(entries, 1, None).unwrap_or_else(|e| panic!("{e}"));
        let mut text = TopKeyText::default();
        describe_entries(&descriptor, &mut text);
        text.as_str().to_owned()
    }

    /// Two descriptors never read the same in a top-keys listing, and a value cannot put
    /// control characters on the terminal of whoever runs `tollgate top`.
    #[test]
    fn top_key_texts_are_unambiguous_and_printable() {
        let one = described(&[("tenant", "acme,user=x"), ("user", "y")]);
        let other = described(&[("tenant", "acme"), ("user", "x,user=y")]);
        assert_ne!(one, other);
        assert_eq!(one, "tenant=acme\\,user\\=x,user=y");
        assert_eq!(described(&[("k", "a\\b")]), "k=a\\\\b");
        assert_eq!(described(&[("k", "\u{1b}[31mred")]), "k=\\u{1b}[31mred");
        // A right-to-left override would show the rest of the line reversed.
        assert_eq!(described(&[("k", "\u{202e}gpj.exe")]), "k=\\u{202e}gpj.exe");
        // A line or paragraph separator would show the rest on a line of its own.
        assert_eq!(
            described(&[("k", "a\u{2028}b\u{2029}c")]),
            "k=a\\u{2028}b\\u{2029}c"
        );
        assert_eq!(described(&[("k", "café")]), "k=café", "other text is kept");
    }
}
