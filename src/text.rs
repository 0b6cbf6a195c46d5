//! Free text that one person types and others read later: an operator's
//! identity and the reason for an operator action, both kept forever in the
//! audit table. Such text must be printable. A control, formatting or
//! separator character can make an audit row read as something it is not
//! (`adm\u{202E}nimda` shows as "admadmin"), so it is refused, never
//! stripped. The rule lives here, once, so the command line and any later
//! entry point (a web console) refuse the same input in the same words.
//! Migration `20261203000002_printable_audit.sql` makes the database refuse
//! the worst of these characters too, whatever client writes the row.
//!
//! Character classes come from the Unicode general category
//! (`unicode-properties`), not from a table kept here: a text is printable
//! when no character of it is a control (Cc), a format character (Cf: bidi
//! embeddings, overrides and isolates, zero-width characters, the byte
//! order mark, the soft hyphen…), a line or paragraph separator (Zl, Zp),
//! a private-use character (Co), a surrogate (Cs) or an unassigned code
//! point or noncharacter (Cn). Letters, marks, digits, punctuation, symbols
//! and spaces of every script are printable, so a Korean name is as valid
//! as a Latin one; text that needs a zero-width joiner or non-joiner (some
//! emoji sequences, Persian words) is refused, the price of a rule an
//! operator can predict.
//!
//! The other direction lives here too: text read back from the database
//! (a program's output in an error message, a worker id, a session's
//! application name) was written by anyone, so every human-readable output
//! passes it through [`escape_for_terminal`], and `--json` output through
//! [`json_for_terminal`], before it reaches an operator's terminal.

use std::borrow::Cow;
use std::fmt;
use std::io;

use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

/// Longest operator identity (`batch_operator_action.operator varchar(80)`).
pub const OPERATOR_MAX_CHARS: usize = 80;
/// Shortest reason: "ok" says nothing.
pub const REASON_MIN_CHARS: usize = 3;
/// Longest reason (`batch_operator_action.reason varchar(500)`).
pub const REASON_MAX_CHARS: usize = 500;

/// Why a character is not printable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unprintable {
    /// Cc: C0 and C1 controls, among them tab and line breaks.
    Control,
    /// Cf: bidi controls, zero-width characters, the byte order mark…
    Format,
    /// Zl or Zp: U+2028 LINE SEPARATOR, U+2029 PARAGRAPH SEPARATOR.
    Separator,
    /// Co.
    PrivateUse,
    /// Cs (never in a Rust string, kept so that every category is named).
    Surrogate,
    /// Cn: not assigned in the Unicode version the crate knows, or a
    /// noncharacter such as U+FFFF.
    Unassigned,
}

impl Unprintable {
    /// The class of `c`, or `None` when it is printable.
    pub fn of(c: char) -> Option<Self> {
        match c.general_category() {
            GeneralCategory::Control => Some(Self::Control),
            GeneralCategory::Format => Some(Self::Format),
            GeneralCategory::LineSeparator | GeneralCategory::ParagraphSeparator => {
                Some(Self::Separator)
            }
            GeneralCategory::PrivateUse => Some(Self::PrivateUse),
            GeneralCategory::Surrogate => Some(Self::Surrogate),
            GeneralCategory::Unassigned => Some(Self::Unassigned),
            _ => None,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::Control => "a control character",
            Self::Format => "a formatting character that can disguise text",
            Self::Separator => "a line or paragraph separator",
            Self::PrivateUse => "a private-use character with no agreed meaning",
            Self::Surrogate => "a surrogate code point",
            Self::Unassigned => "an unassigned code point or noncharacter",
        }
    }
}

/// A refused text, in words an operator can act on. The caller names the
/// field: the command line shows `invalid --operator: contains U+202E
/// (RIGHT-TO-LEFT OVERRIDE), a formatting character that can disguise text;
/// use printable characters`. No variant repeats the text itself, which
/// would carry the very character that disguises it into the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    #[error("contains {}, {}; use printable characters", CodePoint(*ch), class.describe())]
    Unprintable { ch: char, class: Unprintable },
    #[error("is blank; give {min} to {max} printable characters")]
    Blank { min: usize, max: usize },
    #[error("has {found} characters; give {min} to {max} printable characters")]
    Length {
        found: usize,
        min: usize,
        max: usize,
    },
    #[error("{} with whitespace, {}; remove it: an identity is stored exactly as given", if *at_start { "starts" } else { "ends" }, CodePoint(*ch))]
    EdgeWhitespace { ch: char, at_start: bool },
}

/// Checks that every character of `s` is printable (see the module doc).
/// The empty string passes; lengths are the callers' rules.
pub fn printable(s: &str) -> Result<(), TextError> {
    match s.chars().find_map(|c| Unprintable::of(c).map(|k| (c, k))) {
        Some((ch, class)) => Err(TextError::Unprintable { ch, class }),
        None => Ok(()),
    }
}

/// An operator's identity, as the audit stores it: 1-80 printable
/// characters, with no whitespace at either end. Surrounding whitespace is
/// refused rather than trimmed: an identity is compared and grouped as
/// stored, and `--operator "kim "` is more likely a quoting mistake in a
/// script than a name, so the user gets to say which they meant.
pub fn operator(s: &str) -> Result<String, TextError> {
    printable(s)?;
    if s.trim().is_empty() {
        return Err(TextError::Blank {
            min: 1,
            max: OPERATOR_MAX_CHARS,
        });
    }
    // Non-blank, so both ends exist.
    let (first, last) = (s.chars().next(), s.chars().next_back());
    if let Some(ch) = first.filter(|c| c.is_whitespace()) {
        return Err(TextError::EdgeWhitespace { ch, at_start: true });
    }
    if let Some(ch) = last.filter(|c| c.is_whitespace()) {
        return Err(TextError::EdgeWhitespace {
            ch,
            at_start: false,
        });
    }
    check_length(s, 1, OPERATOR_MAX_CHARS)?;
    Ok(s.to_owned())
}

/// The reason for an operator action: 3-500 printable characters after
/// surrounding whitespace is trimmed. Trimming is safe here, unlike for an
/// identity: a reason is prose that is read, never compared, and a trailing
/// line break from `--reason "$(cat note.txt)"` means nothing.
pub fn reason(s: &str) -> Result<String, TextError> {
    let s = s.trim();
    printable(s)?;
    if s.is_empty() {
        return Err(TextError::Blank {
            min: REASON_MIN_CHARS,
            max: REASON_MAX_CHARS,
        });
    }
    check_length(s, REASON_MIN_CHARS, REASON_MAX_CHARS)?;
    Ok(s.to_owned())
}

/// Whether a terminal could act on `c` rather than show it, or show it as
/// something it is not: controls (C0, DEL, C1: escape sequences, bells,
/// backspaces), format characters (bidi overrides and isolates, zero-width
/// characters) and line or paragraph separators. Private-use and unassigned
/// characters show as a box at worst, and are left alone.
fn acts_on_a_terminal(c: char) -> bool {
    matches!(
        Unprintable::of(c),
        Some(Unprintable::Control | Unprintable::Format | Unprintable::Separator)
    )
}

/// `s` with every character a terminal could act on (see
/// [`acts_on_a_terminal`]) written as an escape, so that stored text
/// prints as what it is: `\t`, `\n` and `\r`, `\x1b` for the other C0
/// controls and DEL, `\u{202e}` for the rest (C1 included). Everything else,
/// backslashes too, is kept as it is: the goal is a terminal that only
/// shows, not a reversible encoding (`--json` is that). Borrowed when
/// nothing needs escaping.
pub fn escape_for_terminal(s: &str) -> Cow<'_, str> {
    if !s.chars().any(acts_on_a_terminal) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if acts_on_a_terminal(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `value` as one line of JSON in which every character a terminal could
/// act on is a `\uXXXX` escape (surrogate pairs above the BMP, written by
/// a `Formatter`'s `write_string_fragment`): the same JSON value (any parser reads the
/// same strings back), safe to print. serde_json escapes C0 controls
/// itself but writes DEL, C1 and bidi controls as they are.
pub fn json_for_terminal<T: serde::Serialize + ?Sized>(
    value: &T,
) -> Result<String, serde_json::Error> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, TerminalSafeJson);
    value.serialize(&mut ser)?;
    // serde_json writes UTF-8, and the escapes added are ASCII.
    String::from_utf8(out).map_err(|e| serde::ser::Error::custom(e.to_string()))
}

/// serde_json's compact format, with [`acts_on_a_terminal`] characters
/// escaped inside strings (keys included).
struct TerminalSafeJson;

impl serde_json::ser::Formatter for TerminalSafeJson {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            if acts_on_a_terminal(c) {
                writer.write_all(&fragment.as_bytes()[start..i])?;
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    write!(writer, "\\u{unit:04x}")?;
                }
                start = i + c.len_utf8();
            }
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }
}

fn check_length(s: &str, min: usize, max: usize) -> Result<(), TextError> {
    // Characters, as PostgreSQL's varchar(n) counts them.
    let found = s.chars().count();
    if (min..=max).contains(&found) {
        Ok(())
    } else {
        Err(TextError::Length { found, min, max })
    }
}

/// `U+202E (RIGHT-TO-LEFT OVERRIDE)`, or `U+E000` for a character without a
/// name below. The names are for messages only; the rule is the category.
struct CodePoint(char);

impl fmt::Display for CodePoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "U+{:04X}", self.0 as u32)?;
        match name(self.0) {
            Some(n) => write!(f, " ({n})"),
            None => Ok(()),
        }
    }
}

/// The names of the characters most often met in pasted or spoofed text.
fn name(c: char) -> Option<&'static str> {
    Some(match c {
        '\u{0}' => "NULL",
        '\u{8}' => "BACKSPACE",
        '\t' => "CHARACTER TABULATION",
        '\n' => "LINE FEED",
        '\r' => "CARRIAGE RETURN",
        '\u{1B}' => "ESCAPE",
        ' ' => "SPACE",
        '\u{7F}' => "DELETE",
        '\u{85}' => "NEXT LINE",
        '\u{A0}' => "NO-BREAK SPACE",
        '\u{AD}' => "SOFT HYPHEN",
        '\u{61C}' => "ARABIC LETTER MARK",
        '\u{180E}' => "MONGOLIAN VOWEL SEPARATOR",
        '\u{200B}' => "ZERO WIDTH SPACE",
        '\u{200C}' => "ZERO WIDTH NON-JOINER",
        '\u{200D}' => "ZERO WIDTH JOINER",
        '\u{200E}' => "LEFT-TO-RIGHT MARK",
        '\u{200F}' => "RIGHT-TO-LEFT MARK",
        '\u{2028}' => "LINE SEPARATOR",
        '\u{2029}' => "PARAGRAPH SEPARATOR",
        '\u{202A}' => "LEFT-TO-RIGHT EMBEDDING",
        '\u{202B}' => "RIGHT-TO-LEFT EMBEDDING",
        '\u{202C}' => "POP DIRECTIONAL FORMATTING",
        '\u{202D}' => "LEFT-TO-RIGHT OVERRIDE",
        '\u{202E}' => "RIGHT-TO-LEFT OVERRIDE",
        '\u{2060}' => "WORD JOINER",
        '\u{2061}' => "FUNCTION APPLICATION",
        '\u{2062}' => "INVISIBLE TIMES",
        '\u{2063}' => "INVISIBLE SEPARATOR",
        '\u{2064}' => "INVISIBLE PLUS",
        '\u{2066}' => "LEFT-TO-RIGHT ISOLATE",
        '\u{2067}' => "RIGHT-TO-LEFT ISOLATE",
        '\u{2068}' => "FIRST STRONG ISOLATE",
        '\u{2069}' => "POP DIRECTIONAL ISOLATE",
        '\u{3000}' => "IDEOGRAPHIC SPACE",
        '\u{FEFF}' => "ZERO WIDTH NO-BREAK SPACE",
        _ => return None,
    })
}

/// Longest error message stored (the schema's CHECK on `error_message`).
pub const MAX_ERROR_CHARS: usize = 1000;

/// Truncates to the stored limit on a character boundary.
pub fn truncate(s: &str) -> String {
    match s.char_indices().nth(MAX_ERROR_CHARS) {
        Some((i, _)) => s[..i].to_owned(),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(s: &str) -> Option<Unprintable> {
        match printable(s) {
            Err(TextError::Unprintable { class, .. }) => Some(class),
            _ => None,
        }
    }

    #[test]
    fn every_unprintable_category_is_refused() {
        let cases: &[(&str, Unprintable)] = &[
            // Cc: C0, DEL and C1.
            ("a\u{0}b", Unprintable::Control),
            ("tab\there", Unprintable::Control),
            ("line\nbreak", Unprintable::Control),
            ("bell\u{7}", Unprintable::Control),
            ("esc\u{1B}[31m", Unprintable::Control),
            ("del\u{7F}", Unprintable::Control),
            ("next\u{85}line", Unprintable::Control),
            ("c1\u{9B}", Unprintable::Control),
            // Cf: bidi embeddings, overrides, isolates and marks.
            ("adm\u{202E}nimda", Unprintable::Format),
            ("\u{202A}x", Unprintable::Format),
            ("\u{202B}x", Unprintable::Format),
            ("x\u{202C}", Unprintable::Format),
            ("\u{202D}x", Unprintable::Format),
            ("\u{2066}x\u{2069}", Unprintable::Format),
            ("\u{2067}x", Unprintable::Format),
            ("\u{2068}x", Unprintable::Format),
            ("kim\u{200E}", Unprintable::Format),
            ("kim\u{200F}", Unprintable::Format),
            ("\u{61C}x", Unprintable::Format),
            // Cf: zero-width characters, invisible operators, BOM, soft
            // hyphen, tags.
            ("kim\u{200B}", Unprintable::Format),
            ("k\u{200C}im", Unprintable::Format),
            ("k\u{200D}im", Unprintable::Format),
            ("k\u{2060}im", Unprintable::Format),
            ("a\u{2062}b", Unprintable::Format),
            ("a\u{2064}b", Unprintable::Format),
            ("\u{FEFF}kim", Unprintable::Format),
            ("ki\u{AD}m", Unprintable::Format),
            ("kim\u{E0041}", Unprintable::Format),
            // Zl, Zp.
            ("a\u{2028}b", Unprintable::Separator),
            ("a\u{2029}b", Unprintable::Separator),
            // Co, in the BMP and the supplementary planes.
            ("\u{E000}", Unprintable::PrivateUse),
            ("\u{F8FF}", Unprintable::PrivateUse),
            ("\u{F0000}", Unprintable::PrivateUse),
            ("\u{10FFFD}", Unprintable::PrivateUse),
            // Cn: unassigned code points and noncharacters.
            ("\u{378}", Unprintable::Unassigned),
            ("\u{FDD0}", Unprintable::Unassigned),
            ("\u{FFFF}", Unprintable::Unassigned),
            ("\u{10FFFF}", Unprintable::Unassigned),
            ("\u{E0080}", Unprintable::Unassigned),
        ];
        for (s, want) in cases {
            assert_eq!(class(s), Some(*want), "{s:?}");
            assert!(operator(s).is_err(), "operator {s:?}");
            assert!(reason(&format!("why {s} not")).is_err(), "reason {s:?}");
        }
    }

    #[test]
    fn ordinary_text_of_every_script_is_printable() {
        for s in [
            "kim",
            "김민준",
            "이서연 (운영팀)",
            "Ärger-Müller",
            "Ōtsuka 大塚",
            "Дмитрий",
            "محمد",
            "עברית",
            "नमस्ते",
            "ข้อความ",
            "e\u{301}",
            "ops@example.com",
            "on-call #2, 100% sure: ~$5 & <ok>",
            "restart 🚀",
            "heart ❤\u{FE0F}",
            "nbsp\u{A0}inside",
            "ideographic\u{3000}space",
        ] {
            assert_eq!(printable(s), Ok(()), "{s:?}");
            assert_eq!(operator(s).as_deref(), Ok(s), "{s:?}");
            assert!(reason(&format!("for {s}")).is_ok(), "{s:?}");
        }
    }

    #[test]
    fn messages_name_the_character_and_never_repeat_the_text() {
        let e = operator("adm\u{202E}nimda").unwrap_err().to_string();
        assert_eq!(
            e,
            "contains U+202E (RIGHT-TO-LEFT OVERRIDE), a formatting character that can disguise text; use printable characters"
        );
        let e = reason("why\u{E000}not").unwrap_err().to_string();
        assert!(e.starts_with("contains U+E000, a private-use"), "{e}");
        for bad in ["a\u{202E}b", "a\nb", "a\u{2028}b", " kim", "kim\u{A0}"] {
            let e = operator(bad).unwrap_err().to_string();
            assert!(
                e.chars().all(|c| Unprintable::of(c).is_none()),
                "{e:?} carries an unprintable character"
            );
            assert!(!e.contains(bad), "{e:?} repeats the input");
        }
    }

    #[test]
    fn an_operator_is_stored_exactly_as_given() {
        assert_eq!(operator("kim").unwrap(), "kim");
        assert_eq!(operator("kim min-jun").unwrap(), "kim min-jun");
        assert_eq!(
            operator(" kim"),
            Err(TextError::EdgeWhitespace {
                ch: ' ',
                at_start: true
            })
        );
        assert_eq!(
            operator("kim\u{3000}"),
            Err(TextError::EdgeWhitespace {
                ch: '\u{3000}',
                at_start: false
            })
        );
        assert!(operator("kim\u{A0}")
            .unwrap_err()
            .to_string()
            .starts_with("ends with whitespace, U+00A0 (NO-BREAK SPACE); remove it"));
        for blank in ["", " ", "\u{3000}\u{A0}"] {
            assert!(
                matches!(operator(blank), Err(TextError::Blank { .. })),
                "{blank:?}"
            );
        }
        // A tab is reported as the control character it is.
        assert!(matches!(
            operator("\tkim"),
            Err(TextError::Unprintable {
                class: Unprintable::Control,
                ..
            })
        ));
        assert!(operator(&"가".repeat(80)).is_ok());
        assert_eq!(
            operator(&"가".repeat(81)),
            Err(TextError::Length {
                found: 81,
                min: 1,
                max: 80
            })
        );
    }

    #[test]
    fn stored_text_prints_escaped() {
        let e = |s| escape_for_terminal(s).into_owned();
        assert_eq!(
            e("boom\u{1b}[2J\u{1b}]0;pwned\u{7}"),
            "boom\\x1b[2J\\x1b]0;pwned\\x07"
        );
        assert_eq!(
            e("a\tb\nc\rd\u{0}\u{8}\u{7f}"),
            "a\\tb\\nc\\rd\\x00\\x08\\x7f"
        );
        assert_eq!(e("c1 \u{9b}31m \u{85}"), "c1 \\u{9b}31m \\u{85}");
        assert_eq!(e("adm\u{202e}nimda"), "adm\\u{202e}nimda");
        assert_eq!(
            e("\u{2066}x\u{2069}\u{200b}\u{2028}"),
            "\\u{2066}x\\u{2069}\\u{200b}\\u{2028}"
        );
        assert_eq!(e("kim\u{e0041}"), "kim\\u{e0041}");
        // Printable text of every script is left alone, and not copied.
        for s in [
            "",
            "김민준 exited 1",
            "C:\\path",
            "restart 🚀",
            "nbsp\u{a0}",
            "\u{e000}",
        ] {
            assert!(
                matches!(escape_for_terminal(s), Cow::Borrowed(b) if b == s),
                "{s:?}"
            );
        }
        // Nothing a terminal acts on survives.
        let nasty: String = (0u32..0x3000).filter_map(char::from_u32).collect();
        assert!(!e(&nasty).chars().any(acts_on_a_terminal));
    }

    #[test]
    fn json_for_a_terminal_is_the_same_json_without_raw_controls() {
        let v = serde_json::json!({
            "error": "boom\u{1b}[2J\u{7}\u{7f}\u{9b}adm\u{202e}nimda\u{e0041}",
            "key\u{202e}": ["plain 김", 1, null],
        });
        let line = json_for_terminal(&v).unwrap();
        assert!(!line.chars().any(acts_on_a_terminal), "{line}");
        assert!(!line.contains('\n'));
        assert!(
            line.contains("\\u202e") && line.contains("\\udb40\\udc41"),
            "{line}"
        );
        let back: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back, v);
        assert_eq!(
            json_for_terminal(&serde_json::json!({"a": "b"})).unwrap(),
            "{\"a\":\"b\"}"
        );
    }

    #[test]
    fn a_reason_is_trimmed_then_checked() {
        assert_eq!(reason("  holiday\n").unwrap(), "holiday");
        assert_eq!(
            reason("휴일").unwrap_err().to_string(),
            "has 2 characters; give 3 to 500 printable characters"
        );
        assert!(matches!(reason(" \n "), Err(TextError::Blank { .. })));
        assert!(reason(&"이".repeat(500)).is_ok());
        assert!(reason(&"이".repeat(501)).is_err());
        // Inside the text, a line break is still a control character.
        assert!(matches!(
            reason("two\nlines"),
            Err(TextError::Unprintable {
                class: Unprintable::Control,
                ..
            })
        ));
    }

    #[test]
    fn truncates_on_char_boundary() {
        let s = "가".repeat(1500);
        let t = truncate(&s);
        assert_eq!(t.chars().count(), MAX_ERROR_CHARS);
        assert_eq!(truncate("short"), "short");
    }
}
