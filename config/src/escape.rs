//! Escaping for names that reach a log.
//!
//! Every name a client chooses (object keys, bucket names, metadata names,
//! client-supplied request ids) is logged through [`Escaped`]: control
//! characters (newlines, carriage returns, ESC and the rest of C0/C1, DEL)
//! and the Unicode bidirectional overrides are written as `\u{..}`-style
//! escapes, and a backslash as `\\`, so the logged text is unambiguous and a
//! key can neither start a fake log line nor drive the reader's terminal.

use std::fmt;

/// Displays a client-chosen string with control characters escaped.
///
/// ```
/// use s3dma_config::Escaped;
/// assert_eq!(Escaped("a\nb").to_string(), "a\\nb");
/// assert_eq!(Escaped("\u{1b}[31mred").to_string(), "\\u{1b}[31mred");
/// assert_eq!(Escaped("plain/key.bin").to_string(), "plain/key.bin");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Escaped<'a>(pub &'a str);

/// Characters that reorder how the text around them is shown ("Trojan
/// source"): escaped like control characters.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        if !s
            .chars()
            .any(|c| c == '\\' || c.is_control() || is_bidi_control(c))
        {
            return f.write_str(s);
        }
        for c in s.chars() {
            if c == '\\' || c.is_control() || is_bidi_control(c) {
                write!(f, "{}", c.escape_default())?;
            } else {
                fmt::Write::write_char(f, c)?;
            }
        }
        Ok(())
    }
}

/// Displays bytes that should be UTF-8 (a header value, a request id):
/// valid UTF-8 as [`Escaped`], anything else byte by byte as `\xNN`.
#[derive(Debug, Clone, Copy)]
pub struct EscapedBytes<'a>(pub &'a [u8]);

impl fmt::Display for EscapedBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match std::str::from_utf8(self.0) {
            Ok(s) => Escaped(s).fmt(f),
            Err(_) => {
                for &b in self.0 {
                    if b.is_ascii_graphic() && b != b'\\' || b == b' ' {
                        fmt::Write::write_char(f, char::from(b))?;
                    } else {
                        write!(f, "\\x{b:02x}")?;
                    }
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_control_character_survives() {
        for s in [
            "k\nINFO forged line tenant=bob",
            "k\r\n",
            "\u{1b}[2J",
            "tab\there",
            "\u{7f}del",
            "\u{85}nel",
            "bidi\u{202e}txt.exe",
            "back\\slash",
        ] {
            let out = Escaped(s).to_string();
            assert!(
                !out.chars().any(|c| c.is_control() || is_bidi_control(c)),
                "{s:?} -> {out:?}"
            );
        }
        assert_eq!(Escaped("back\\slash").to_string(), "back\\\\slash");
        assert_eq!(Escaped("é/日本").to_string(), "é/日本");
    }

    #[test]
    fn bytes_that_are_not_utf8() {
        assert_eq!(EscapedBytes(b"ab\xff\n").to_string(), "ab\\xff\\x0a");
        assert_eq!(EscapedBytes(b"ok id").to_string(), "ok id");
    }
}
