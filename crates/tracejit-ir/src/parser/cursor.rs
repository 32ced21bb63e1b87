//! A cursor over one line of the text form: the token readers the graph and
//! op parsers share (words, numbers, quoted strings, value ids, types), each
//! of which reports a [`ParseError`] naming the line, the 1-based column and
//! what it expected versus what it found.
//!
//! The text form is line-oriented (a node never spans lines), so the cursor
//! never crosses a newline; whitespace between tokens is insignificant.

use tracejit_tensor::DType;

use super::ParseError;
use crate::{Dims, TensorType};

/// A position in one line; `text` is the whole line, indentation included,
/// so columns match what an editor shows.
pub(crate) struct Cursor<'a> {
    text: &'a str,
    pos: usize,
    line: usize,
    /// A byte position and the characters before it: [`Cursor::column`]
    /// counts on from there, so a line of n values (a constant printed in
    /// full) costs O(n), not O(n^2), although every value asks its column.
    counted: (usize, usize),
}

impl<'a> Cursor<'a> {
    /// A cursor at byte `pos` of line `line` (1-based) whose text is `text`.
    pub(crate) fn new(text: &'a str, line: usize, pos: usize) -> Cursor<'a> {
        Cursor { text, pos, line, counted: (0, 0) }
    }

    /// The 1-based line number.
    pub(crate) fn line(&self) -> usize {
        self.line
    }

    /// The 1-based column (in characters) of the next token.
    pub(crate) fn column(&mut self) -> usize {
        self.skip_ws();
        let (from, before) = if self.counted.0 <= self.pos { self.counted } else { (0, 0) };
        let chars = before + self.text[from..self.pos].chars().count();
        self.counted = (self.pos, chars);
        chars + 1
    }

    fn rest(&self) -> &'a str {
        &self.text[self.pos..]
    }

    fn skip_ws(&mut self) {
        let rest = self.rest();
        self.pos += rest.len() - rest.trim_start().len();
    }

    /// The next token as an error message shows it.
    fn found(&mut self) -> String {
        self.skip_ws();
        let rest = self.rest();
        if rest.is_empty() {
            return "end of line".into();
        }
        let end = rest
            .char_indices()
            .find(|&(i, c)| i > 0 && (c.is_whitespace() || ",()[]:".contains(c) || !is_word_char(c)))
            .map_or(rest.len(), |(i, _)| i);
        let token: String = rest[..end].chars().take(24).collect();
        format!("`{token}`")
    }

    /// An error at the next token: expected `expected`, found whatever is there.
    pub(crate) fn unexpected(&mut self, expected: impl Into<String>) -> ParseError {
        let column = self.column();
        let found = self.found();
        ParseError::Unexpected { line: self.line, column, expected: expected.into(), found }
    }

    /// An error at the next token with a free-form message.
    pub(crate) fn invalid(&mut self, message: impl Into<String>) -> ParseError {
        let column = self.column();
        ParseError::Invalid { line: self.line, column, message: message.into() }
    }

    /// True at the end of the line (trailing whitespace and a trailing
    /// `; comment`, such as a node's source location, ignored).
    pub(crate) fn at_end(&mut self) -> bool {
        self.skip_ws();
        self.rest().is_empty() || self.rest().starts_with(';')
    }

    /// Fails unless the line is finished.
    pub(crate) fn expect_end(&mut self) -> Result<(), ParseError> {
        if self.at_end() {
            Ok(())
        } else {
            Err(self.unexpected("end of line"))
        }
    }

    /// The next character, without consuming it.
    pub(crate) fn peek(&mut self) -> Option<char> {
        self.skip_ws();
        self.rest().chars().next()
    }

    /// Consumes `token` if it comes next.
    pub(crate) fn eat(&mut self, token: &str) -> bool {
        self.skip_ws();
        if self.rest().starts_with(token) {
            self.pos += token.len();
            true
        } else {
            false
        }
    }

    /// Consumes `token` or fails naming it.
    pub(crate) fn expect(&mut self, token: &str) -> Result<(), ParseError> {
        if self.eat(token) {
            Ok(())
        } else {
            Err(self.unexpected(format!("`{token}`")))
        }
    }

    /// Consumes `key=`.
    pub(crate) fn key(&mut self, key: &str) -> Result<(), ParseError> {
        self.expect(key)?;
        self.expect("=")
    }

    /// A word of letters, digits, `_` and `.` (op and dtype names, numbers).
    pub(crate) fn word(&mut self, what: &str) -> Result<&'a str, ParseError> {
        self.skip_ws();
        let rest = self.rest();
        let end = rest.char_indices().find(|&(_, c)| !is_word_char(c)).map_or(rest.len(), |(i, _)| i);
        if end == 0 {
            return Err(self.unexpected(what));
        }
        self.pos += end;
        Ok(&rest[..end])
    }

    /// A raw token up to the next whitespace, `,`, `]` or `)`: a constant's
    /// element (`-0.0`, `NaN(0x7fc00001)`, `true`).
    pub(crate) fn atom(&mut self, what: &str) -> Result<&'a str, ParseError> {
        self.skip_ws();
        let rest = self.rest();
        let mut depth = 0usize;
        let end = rest
            .char_indices()
            .find(|&(_, c)| match c {
                '(' => {
                    depth += 1;
                    false
                }
                ')' if depth > 0 => {
                    depth -= 1;
                    false
                }
                c => depth == 0 && (c.is_whitespace() || c == ',' || c == ']' || c == ')'),
            })
            .map_or(rest.len(), |(i, _)| i);
        if end == 0 {
            return Err(self.unexpected(what));
        }
        self.pos += end;
        Ok(&rest[..end])
    }

    /// Parses the next word as a `T` (`usize`, `i64`, `u32`, `bool`).
    pub(crate) fn number<T: std::str::FromStr>(&mut self, what: &str) -> Result<T, ParseError> {
        let column = self.column();
        self.skip_ws();
        let rest = self.rest();
        let len = rest
            .char_indices()
            .find(|&(i, c)| !(is_word_char(c) || (i == 0 && c == '-')))
            .map_or(rest.len(), |(i, _)| i);
        let text = &rest[..len];
        match text.parse::<T>() {
            Ok(v) if len > 0 => {
                self.pos += len;
                Ok(v)
            }
            _ => Err(ParseError::Unexpected {
                line: self.line,
                column,
                expected: what.into(),
                found: if text.is_empty() { self.found() } else { format!("`{text}`") },
            }),
        }
    }

    /// A list `[a, b, c]` of items read by `item`.
    pub(crate) fn list<T>(
        &mut self,
        open: &str,
        close: &str,
        mut item: impl FnMut(&mut Cursor<'a>) -> Result<T, ParseError>,
    ) -> Result<Vec<T>, ParseError> {
        self.expect(open)?;
        let mut items = Vec::new();
        if self.eat(close) {
            return Ok(items);
        }
        loop {
            items.push(item(self)?);
            if self.eat(close) {
                return Ok(items);
            }
            if !self.eat(",") {
                return Err(self.unexpected(format!("`,` or `{close}`")));
            }
        }
    }

    /// A string in Rust `{:?}` form: `"a \"b\" \u{1b}"`.
    pub(crate) fn string(&mut self, what: &str) -> Result<String, ParseError> {
        self.skip_ws();
        if !self.rest().starts_with('"') {
            return Err(self.unexpected(what));
        }
        let column = self.column();
        let unterminated = |line| ParseError::Invalid { line, column, message: "unterminated string".into() };
        let mut out = String::new();
        let mut chars = self.rest().char_indices().skip(1);
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.pos += i + 1;
                    return Ok(out);
                }
                '\\' => {
                    let (_, e) = chars.next().ok_or_else(|| unterminated(self.line))?;
                    match e {
                        'n' => out.push('\n'),
                        't' => out.push('\t'),
                        'r' => out.push('\r'),
                        '0' => out.push('\0'),
                        '\\' | '"' | '\'' => out.push(e),
                        'u' => {
                            let mut hex = String::new();
                            if chars.next().map(|(_, c)| c) != Some('{') {
                                return Err(unterminated(self.line));
                            }
                            for (_, h) in chars.by_ref() {
                                if h == '}' {
                                    break;
                                }
                                hex.push(h);
                            }
                            let ch = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32).ok_or_else(|| {
                                ParseError::Invalid {
                                    line: self.line,
                                    column,
                                    message: format!("bad escape \\u{{{hex}}}"),
                                }
                            })?;
                            out.push(ch);
                        }
                        other => {
                            return Err(ParseError::Invalid {
                                line: self.line,
                                column,
                                message: format!("unknown escape `\\{other}` in a string"),
                            })
                        }
                    }
                }
                c => out.push(c),
            }
        }
        Err(unterminated(self.line))
    }

    /// A value id: `%3` or `%3.1`, as (node index, output index).
    pub(crate) fn value_id(&mut self) -> Result<(u32, u32), ParseError> {
        if !self.eat("%") {
            return Err(self.unexpected("a value such as `%3`"));
        }
        let word = self.word("a value number")?;
        let (node, index) = word.split_once('.').unwrap_or((word, "0"));
        match (node.parse(), index.parse()) {
            (Ok(n), Ok(i)) => Ok((n, i)),
            _ => Err(self.invalid(format!("`%{word}` is not a value number"))),
        }
    }

    /// A dtype name: `f32`, `i64`, `bool`.
    pub(crate) fn dtype(&mut self) -> Result<DType, ParseError> {
        let start = self.pos;
        let word = self.word("a dtype")?;
        match DType::ALL.into_iter().find(|d| d.name() == word) {
            Some(d) => Ok(d),
            None => {
                self.pos = start;
                Err(self.unexpected(format!("a dtype ({})", dtype_names())))
            }
        }
    }

    /// A type: `f32[?, 784]`.
    pub(crate) fn tensor_type(&mut self) -> Result<TensorType, ParseError> {
        let dtype = self.dtype()?;
        let dims =
            self.list("[", "]", |c| if c.eat("?") { Ok(None) } else { c.number("a dimension or `?`").map(Some) })?;
        Ok(TensorType { dtype, dims: Dims::from_vec(dims) })
    }
}

/// Characters of words: names, numbers, value ids.
fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '.'
}

/// `f32, f64, ...` for error messages.
fn dtype_names() -> String {
    DType::ALL.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ")
}
