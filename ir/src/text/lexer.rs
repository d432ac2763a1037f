//! Splits text into tokens with their positions.
//!
//! The whole input is tokenized up front: the grammar never needs lexer
//! feedback, and a token vector makes one-token lookahead and "expected X,
//! found Y" messages trivial. Newlines are not significant; `//` starts a
//! comment that runs to the end of the line.

use crate::{Loc, ParseError};
use std::fmt;

/// What a token is. Texts exclude the sigil (`%`, `@`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    /// `[A-Za-z_][A-Za-z0-9_.]*`: keywords, mnemonics, dtypes, attribute
    /// and axis names, `true`, `inf`, ...
    Ident(String),
    /// `%name` or `%N`.
    Value(String),
    /// `@name`.
    Func(String),
    /// A number as written, sign included (`-3`, `1.5e-8`); validated by
    /// whoever knows what kind of number is expected.
    Number(String),
    /// A single punctuation character: `( ) [ ] { } , : = ?`.
    Punct(char),
    /// `-` not starting a number (as in `-inf`).
    Minus,
    /// `->`.
    Arrow,
    /// End of input.
    Eof,
}

impl fmt::Display for Tok {
    /// How a token is named in "found ..." messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) | Tok::Number(s) => write!(f, "`{s}`"),
            Tok::Value(s) => write!(f, "`%{s}`"),
            Tok::Func(s) => write!(f, "`@{s}`"),
            Tok::Punct(c) => write!(f, "`{c}`"),
            Tok::Minus => f.write_str("`-`"),
            Tok::Arrow => f.write_str("`->`"),
            Tok::Eof => f.write_str("end of input"),
        }
    }
}

/// A token and where it starts.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Token {
    /// The token.
    pub tok: Tok,
    /// Its first character.
    pub loc: Loc,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.'
}

struct Cursor<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: u32,
    col: u32,
}

impl Cursor<'_> {
    fn peek(&mut self) -> Option<char> {
        self.chars.peek().copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next()?;
        if c == '\n' {
            self.line = self.line.saturating_add(1);
            self.col = 1;
        } else {
            self.col = self.col.saturating_add(1);
        }
        Some(c)
    }

    fn loc(&self) -> Loc {
        Loc { line: self.line, col: self.col }
    }

    /// Consumes characters while `pred` holds and returns them.
    fn take_while(&mut self, pred: impl Fn(char) -> bool) -> String {
        let mut s = String::new();
        while let Some(c) = self.peek().filter(|&c| pred(c)) {
            s.push(c);
            self.bump();
        }
        s
    }

    /// The characters of a number after its first digit: digits, letters,
    /// `.`, `_`, and a sign directly after an exponent marker.
    fn number_tail(&mut self, s: &mut String) {
        while let Some(c) = self.peek() {
            let exp_sign = (c == '+' || c == '-') && s.ends_with(['e', 'E']);
            if !(is_name_char(c) || exp_sign) {
                break;
            }
            s.push(c);
            self.bump();
        }
    }
}

/// Tokenizes `text`. The result always ends with [`Tok::Eof`].
pub(crate) fn lex(text: &str) -> Result<Vec<Token>, ParseError> {
    let mut cur = Cursor { chars: text.chars().peekable(), line: 1, col: 1 };
    let mut out = Vec::new();
    loop {
        cur.take_while(char::is_whitespace);
        let loc = cur.loc();
        let Some(c) = cur.bump() else {
            out.push(Token { tok: Tok::Eof, loc });
            return Ok(out);
        };
        let tok = match c {
            '/' if cur.peek() == Some('/') => {
                cur.take_while(|c| c != '\n');
                continue;
            }
            '%' | '@' => {
                let name = cur.take_while(is_name_char);
                if name.is_empty() {
                    let what = if c == '%' { "a value name or id" } else { "a function name" };
                    let found = cur.peek().map_or("end of input".to_string(), |c| format!("`{c}`"));
                    return Err(ParseError {
                        loc: cur.loc(),
                        message: format!("expected {what} after `{c}`, found {found}"),
                    });
                }
                if c == '%' {
                    Tok::Value(name)
                } else if crate::verify::is_identifier(&name) {
                    Tok::Func(name)
                } else {
                    return Err(ParseError {
                        loc,
                        message: format!(
                            "`@{name}` is not a valid function name (names match [A-Za-z_][A-Za-z0-9_.]*)"
                        ),
                    });
                }
            }
            '-' if cur.peek() == Some('>') => {
                cur.bump();
                Tok::Arrow
            }
            '-' if cur.peek().is_some_and(|c| c.is_ascii_digit()) => {
                let mut s = String::from("-");
                cur.number_tail(&mut s);
                Tok::Number(s)
            }
            '-' => Tok::Minus,
            c if c.is_ascii_digit() => {
                let mut s = String::from(c);
                cur.number_tail(&mut s);
                Tok::Number(s)
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let mut s = String::from(c);
                s.push_str(&cur.take_while(is_name_char));
                Tok::Ident(s)
            }
            '(' | ')' | '[' | ']' | '{' | '}' | ',' | ':' | '=' | '?' => Tok::Punct(c),
            c => {
                return Err(ParseError { loc, message: format!("unexpected character `{}`", c.escape_debug()) });
            }
        };
        out.push(Token { tok, loc });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        lex(s).unwrap().into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn tokens_and_positions() {
        let t = lex("func @f(%x: f32[2]) // c\n  -> -inf 1e-8").unwrap();
        let kinds: Vec<&Tok> = t.iter().map(|t| &t.tok).collect();
        assert_eq!(kinds[0], &Tok::Ident("func".into()));
        assert_eq!(kinds[1], &Tok::Func("f".into()));
        assert_eq!(kinds[3], &Tok::Value("x".into()));
        assert_eq!(t[10].loc, Loc { line: 2, col: 3 });
        assert_eq!(
            kinds[10..],
            [&Tok::Arrow, &Tok::Minus, &Tok::Ident("inf".into()), &Tok::Number("1e-8".into()), &Tok::Eof]
        );
    }

    #[test]
    fn numbers_keep_their_sign_and_exponent() {
        assert_eq!(
            toks("-3 2.5E+7 1.2.3"),
            [Tok::Number("-3".into()), Tok::Number("2.5E+7".into()), Tok::Number("1.2.3".into()), Tok::Eof]
        );
    }

    #[test]
    fn errors_have_positions() {
        let e = lex("func @f\n  $").unwrap_err();
        assert_eq!((e.loc, e.message.as_str()), (Loc { line: 2, col: 3 }, "unexpected character `$`"));
        assert!(lex("% x").unwrap_err().message.contains("expected a value name or id after `%`, found ` `"));
        assert!(lex("@0f").unwrap_err().message.contains("not a valid function name"));
    }
}
