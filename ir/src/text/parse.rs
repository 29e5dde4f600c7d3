//! The parser: a small lexer and a recursive-descent reader of the form `print` writes.

use std::collections::HashMap;

use std::sync::Arc;

use crate::op::{Attr, Attrs, Subgraph};
use crate::{DType, Dim, Graph, IrError, Op, Result, Shape, Tensor, TensorType, ValueId};

/// Parses a graph in kiln's text form. Errors give the line and column.
pub fn parse(text: &str) -> Result<Graph> {
    let tokens = lex(text)?;
    let mut p = Parser { tokens, pos: 0 };
    let g = p.graph()?;
    if let Some(t) = p.tokens.get(p.pos) {
        return Err(err_at(t, "unexpected text after the graph"));
    }
    Ok(g)
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    /// A bare word: keywords, op names, attribute names, dtypes, symbols.
    Word(String),
    /// `%name`, quoted or not.
    Value(String),
    Str(String),
    Num(String),
    Punct(char),
}

#[derive(Clone, Debug)]
struct Token {
    tok: Tok,
    line: usize,
    column: usize,
}

fn err_at(t: &Token, msg: impl Into<String>) -> IrError {
    IrError::Parse { line: t.line, column: t.column, msg: msg.into() }
}

struct Cursor {
    chars: Vec<char>,
    i: usize,
    line: usize,
    column: usize,
}

impl Cursor {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.i + ahead).copied()
    }

    fn bump(&mut self) {
        if self.chars[self.i] == '\n' {
            self.line += 1;
            self.column = 1;
        } else {
            self.column += 1;
        }
        self.i += 1;
    }

    fn bump_n(&mut self, n: usize) {
        for _ in 0..n {
            self.bump();
        }
    }

    /// Consumes characters while `f` holds and returns them.
    fn take_while(&mut self, f: impl Fn(char) -> bool) -> String {
        let start = self.i;
        while self.peek(0).is_some_and(&f) {
            self.bump();
        }
        self.chars[start..self.i].iter().collect()
    }
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/')
}

fn lex(text: &str) -> Result<Vec<Token>> {
    let mut cur = Cursor { chars: text.chars().collect(), i: 0, line: 1, column: 1 };
    let mut out = Vec::new();
    while let Some(c) = cur.peek(0) {
        let (line, column) = (cur.line, cur.column);
        let here = |msg: &str| IrError::Parse { line, column, msg: msg.to_string() };
        if c.is_whitespace() {
            cur.bump();
            continue;
        }
        if c == '/' && cur.peek(1) == Some('/') {
            cur.take_while(|c| c != '\n');
            continue;
        }
        let tok = if c == '"' {
            let (s, used) = lex_string(&cur.chars[cur.i..]).map_err(|e| here(&e.to_string()))?;
            cur.bump_n(used);
            Tok::Str(s)
        } else if c == '%' {
            cur.bump();
            if cur.peek(0) == Some('"') {
                let (s, used) =
                    lex_string(&cur.chars[cur.i..]).map_err(|e| here(&e.to_string()))?;
                cur.bump_n(used);
                Tok::Value(s)
            } else {
                let name = cur.take_while(is_word_char);
                if name.is_empty() {
                    return Err(here("expected a name after %"));
                }
                Tok::Value(name)
            }
        } else if c.is_ascii_digit()
            || (c == '-' && cur.peek(1).is_some_and(|d| d.is_ascii_digit() || d == 'i'))
        {
            let mut n = String::from(c);
            cur.bump();
            // Digits, letters (exponent, inf), dots; a sign only right after an exponent marker.
            while let Some(d) = cur.peek(0) {
                let sign_ok = matches!(d, '+' | '-') && n.ends_with(['e', 'E']);
                if !(d.is_ascii_alphanumeric() || d == '.' || sign_ok) {
                    break;
                }
                n.push(d);
                cur.bump();
            }
            Tok::Num(n)
        } else if c.is_ascii_alphabetic() || c == '_' {
            Tok::Word(cur.take_while(is_word_char))
        } else if "{}()[],=:<>#".contains(c) {
            cur.bump();
            Tok::Punct(c)
        } else {
            return Err(here(&format!("unexpected character {c:?}")));
        };
        out.push(Token { tok, line, column });
    }
    Ok(out)
}

/// Why a string literal does not lex.
#[derive(Debug, thiserror::Error)]
enum BadString {
    #[error("unterminated string")]
    Unterminated,
    #[error("unterminated escape")]
    UnterminatedEscape,
    #[error("bad \\u escape")]
    Unicode,
    #[error("unknown escape \\{0}")]
    UnknownEscape(char),
}

/// A double-quoted string with Rust's escapes (as `{:?}` writes them); returns it and the chars used.
fn lex_string(chars: &[char]) -> std::result::Result<(String, usize), BadString> {
    let mut s = String::new();
    let mut i = 1;
    loop {
        match chars.get(i) {
            None => return Err(BadString::Unterminated),
            Some('"') => return Ok((s, i + 1)),
            Some('\\') => {
                let e = chars.get(i + 1).ok_or(BadString::UnterminatedEscape)?;
                i += 2;
                match e {
                    'n' => s.push('\n'),
                    't' => s.push('\t'),
                    'r' => s.push('\r'),
                    '0' => s.push('\0'),
                    '\\' | '"' | '\'' => s.push(*e),
                    'u' => {
                        if chars.get(i) != Some(&'{') {
                            return Err(BadString::Unicode);
                        }
                        let end =
                            chars[i..].iter().position(|&c| c == '}').ok_or(BadString::Unicode)?
                                + i;
                        let hex: String = chars[i + 1..end].iter().collect();
                        let c = u32::from_str_radix(&hex, 16)
                            .ok()
                            .and_then(char::from_u32)
                            .ok_or(BadString::Unicode)?;
                        s.push(c);
                        i = end + 1;
                    }
                    other => return Err(BadString::UnknownEscape(*other)),
                }
            }
            Some(&c) => {
                s.push(c);
                i += 1;
            }
        }
    }
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.pos).map(|t| &t.tok)
    }

    fn here(&self) -> Token {
        self.tokens.get(self.pos).cloned().unwrap_or_else(|| {
            let last = self.tokens.last();
            Token {
                tok: Tok::Punct(' '),
                line: last.map_or(1, |t| t.line),
                column: last.map_or(1, |t| t.column + 1),
            }
        })
    }

    fn fail<T>(&self, msg: impl Into<String>) -> Result<T> {
        Err(err_at(&self.here(), msg))
    }

    fn next(&mut self) -> Result<Tok> {
        match self.tokens.get(self.pos) {
            Some(t) => {
                self.pos += 1;
                Ok(t.tok.clone())
            }
            None => self.fail("unexpected end of text"),
        }
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Punct(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char) -> Result<()> {
        if self.eat(c) {
            Ok(())
        } else {
            self.fail(format!("expected `{c}`"))
        }
    }

    fn word(&mut self) -> Result<String> {
        match self.peek() {
            Some(Tok::Word(w)) => {
                let w = w.clone();
                self.pos += 1;
                Ok(w)
            }
            _ => self.fail("expected a word"),
        }
    }

    fn keyword(&mut self, k: &str) -> Result<()> {
        match self.peek() {
            Some(Tok::Word(w)) if w == k => {
                self.pos += 1;
                Ok(())
            }
            _ => self.fail(format!("expected `{k}`")),
        }
    }

    /// A bare or quoted name.
    fn name(&mut self) -> Result<String> {
        match self.next()? {
            Tok::Word(w) => Ok(w),
            Tok::Str(s) => Ok(s),
            _ => {
                self.pos -= 1;
                self.fail("expected a name")
            }
        }
    }

    fn value_name(&mut self) -> Result<String> {
        match self.next()? {
            Tok::Value(v) => Ok(v),
            _ => {
                self.pos -= 1;
                self.fail("expected a %value")
            }
        }
    }

    fn graph(&mut self) -> Result<Graph> {
        self.keyword("graph")?;
        let name = self.name()?;
        self.expect('{')?;
        let mut g = Graph::new(&name);
        let mut values: HashMap<String, ValueId> = HashMap::new();
        loop {
            let at = self.here();
            match self.peek() {
                Some(Tok::Punct('}')) => {
                    self.pos += 1;
                    break;
                }
                Some(Tok::Word(w)) if w == "input" => {
                    self.pos += 1;
                    let name = self.value_name()?;
                    self.expect(':')?;
                    let ty = self.tensor_type()?;
                    let v = g.add_input(&name, ty).map_err(|e| err_at(&at, e.to_string()))?;
                    values.insert(name, v);
                }
                Some(Tok::Word(w)) if w == "output" => {
                    self.pos += 1;
                    let name = self.value_name()?;
                    let v = if self.eat('=') {
                        self.value_ref(&values)?
                    } else {
                        self.resolve(&values, &name, &at)?
                    };
                    g.add_output(&name, v).map_err(|e| err_at(&at, e.to_string()))?;
                }
                Some(Tok::Value(_)) => self.node(&mut g, &mut values)?,
                _ => return self.fail("expected `input`, `output`, a %node or `}`"),
            }
        }
        Ok(g)
    }

    fn resolve(
        &self,
        values: &HashMap<String, ValueId>,
        name: &str,
        at: &Token,
    ) -> Result<ValueId> {
        values
            .get(name)
            .copied()
            .ok_or_else(|| err_at(at, format!("%{name} is not defined before this use")))
    }

    /// `%name` or `%name#i`.
    fn value_ref(&mut self, values: &HashMap<String, ValueId>) -> Result<ValueId> {
        let at = self.here();
        let name = self.value_name()?;
        let v = self.resolve(values, &name, &at)?;
        if self.eat('#') {
            let i = self.usize()?;
            return Ok(ValueId::new(v.node, i));
        }
        Ok(v)
    }

    fn node(&mut self, g: &mut Graph, values: &mut HashMap<String, ValueId>) -> Result<()> {
        let at = self.here();
        let name = self.value_name()?;
        self.expect(':')?;
        let types = if self.eat('(') {
            let mut types = vec![self.tensor_type()?];
            while self.eat(',') {
                types.push(self.tensor_type()?);
            }
            self.expect(')')?;
            types
        } else {
            vec![self.tensor_type()?]
        };
        self.expect('=')?;
        let op_at = self.here();
        let op_name = self.word()?;
        let err = |e: IrError| err_at(&at, e.to_string());
        if op_name == "Constant" {
            let t = self.tensor_data(&types[0])?;
            let v = g.add_constant(&name, t).map_err(err)?;
            values.insert(name, v);
            return Ok(());
        }
        let mut operands = Vec::new();
        self.expect('(')?;
        if !self.eat(')') {
            loop {
                if matches!(self.peek(), Some(Tok::Word(w)) if w == "_") {
                    self.pos += 1;
                    operands.push(None);
                } else {
                    operands.push(Some(self.value_ref(values)?));
                }
                if self.eat(')') {
                    break;
                }
                self.expect(',')?;
            }
        }
        let mut attrs = Attrs::new();
        if self.eat('{') {
            loop {
                let key = self.word()?;
                self.expect('=')?;
                let v = self.attr()?;
                attrs.push(&key, v);
                if self.eat('}') {
                    break;
                }
                self.expect(',')?;
            }
        }
        let op = Op::from_attrs(&op_name, attrs).map_err(|e| err_at(&op_at, e.to_string()))?;
        let id = g.add_node_with_outputs(&name, op, &operands, types.len()).map_err(err)?;
        g.declare_output_types(id, types).map_err(err)?;
        values.insert(name, id.into());
        Ok(())
    }

    fn usize(&mut self) -> Result<usize> {
        match self.next()? {
            Tok::Num(n) => n.parse().or_else(|_| self.fail(format!("`{n}` is not a size"))),
            _ => {
                self.pos -= 1;
                self.fail("expected a number")
            }
        }
    }

    /// `f32[4,batch,"seq len"]`, or a sequence or optional type (see `TensorType`'s Display).
    fn tensor_type(&mut self) -> Result<TensorType> {
        let w = self.word()?;
        match w.as_str() {
            "seq" => {
                self.expect('(')?;
                let (dtype, elem) = self.element_type()?;
                let len = if self.eat(',') {
                    match self.next()? {
                        Tok::Num(n) => Some(
                            n.parse().or_else(|_| self.fail(format!("`{n}` is not a length")))?,
                        ),
                        _ => return self.fail("expected a sequence length"),
                    }
                } else {
                    None
                };
                self.expect(')')?;
                return Ok(TensorType::sequence(dtype, elem, len));
            }
            "opt" => {
                self.expect('(')?;
                let inner = if matches!(self.peek(), Some(Tok::Word(w)) if w == "seq") {
                    self.tensor_type()?
                } else {
                    let (dtype, elem) = self.element_type()?;
                    let ranked = elem.is_some();
                    TensorType {
                        dtype,
                        shape: elem.unwrap_or_else(Shape::scalar),
                        kind: crate::Kind::Optional { sequence: false, ranked },
                    }
                };
                self.expect(')')?;
                return Ok(match inner.kind {
                    crate::Kind::Optional { .. } => inner,
                    _ => TensorType::optional(&inner),
                });
            }
            _ => {}
        }
        self.pos -= 1;
        let (dtype, shape) = self.element_type()?;
        match shape {
            Some(shape) => Ok(TensorType::new(dtype, shape)),
            None => self.fail("expected `[` and the shape"),
        }
    }

    /// A dtype and, when `[...]` follows, a shape.
    fn element_type(&mut self) -> Result<(DType, Option<Shape>)> {
        let w = self.word()?;
        let dtype =
            DType::from_name(&w).map_or_else(|| self.fail(format!("unknown type `{w}`")), Ok)?;
        if self.peek() != Some(&Tok::Punct('[')) {
            return Ok((dtype, None));
        }
        self.expect('[')?;
        let mut dims = Vec::new();
        if !self.eat(']') {
            loop {
                dims.push(match self.next()? {
                    Tok::Num(n) => Dim::Fixed(
                        n.parse().or_else(|_| self.fail(format!("`{n}` is not a size")))?,
                    ),
                    Tok::Word(s) | Tok::Str(s) => Dim::sym(&s),
                    _ => return self.fail("expected a size or a symbol"),
                });
                if self.eat(']') {
                    break;
                }
                self.expect(',')?;
            }
        }
        Ok((dtype, Some(Shape(dims))))
    }

    /// The data of a tensor of type `ty`: `[v, ...]` or `hex"..."`.
    fn tensor_data(&mut self, ty: &TensorType) -> Result<Tensor> {
        let at = self.here();
        let dims = ty
            .shape
            .as_fixed()
            .ok_or_else(|| err_at(&at, format!("a constant needs a fixed shape, got {ty}")))?;
        if self.eat('<') {
            return self.fail(
                "this constant's data is elided; only text printed with full weights parses back",
            );
        }
        if self.peek() == Some(&Tok::Word("hex".into())) {
            self.pos += 1;
            let Tok::Str(hex) = self.next()? else { return self.fail("expected a hex string") };
            let bytes = (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2).unwrap_or("zz"), 16))
                .collect::<std::result::Result<Vec<u8>, _>>()
                .map_err(|_| err_at(&at, "bad hex data"))?;
            if hex.len() % 2 != 0 {
                return Err(err_at(&at, "bad hex data"));
            }
            return Tensor::from_bytes(ty.dtype, &dims, &bytes)
                .map_err(|e| err_at(&at, e.to_string()));
        }
        self.expect('[')?;
        let mut items = Vec::new();
        if !self.eat(']') {
            loop {
                items.push(self.next()?);
                if self.eat(']') {
                    break;
                }
                self.expect(',')?;
            }
        }
        let n = crate::size::checked_bytes(&dims, ty.dtype)
            .map_err(|e| err_at(&at, e.to_string()))?
            / ty.dtype.size().max(1);
        if items.len() != n {
            return Err(err_at(&at, format!("{ty} holds {n} values, {} given", items.len())));
        }
        let bad = |t: &Tok| err_at(&at, format!("{t:?} is not a {} value", ty.dtype));
        match ty.dtype {
            DType::String => {
                let v = items
                    .into_iter()
                    .map(|t| match t {
                        Tok::Str(s) => Ok(s),
                        t => Err(bad(&t)),
                    })
                    .collect::<Result<Vec<String>>>()?;
                Tensor::from_strings(&dims, v)
            }
            DType::Bool => {
                let v = items
                    .iter()
                    .map(|t| match t {
                        Tok::Word(w) if w == "true" => Ok(true),
                        Tok::Word(w) if w == "false" => Ok(false),
                        t => Err(bad(t)),
                    })
                    .collect::<Result<Vec<bool>>>()?;
                Tensor::from_vec(&dims, v)
            }
            DType::I64 => Tensor::from_vec(
                &dims,
                items
                    .iter()
                    .map(|t| num(t).and_then(|s| s.parse::<i64>().ok()).ok_or_else(|| bad(t)))
                    .collect::<Result<Vec<i64>>>()?,
            ),
            DType::U64 => Tensor::from_vec(
                &dims,
                items
                    .iter()
                    .map(|t| num(t).and_then(|s| s.parse::<u64>().ok()).ok_or_else(|| bad(t)))
                    .collect::<Result<Vec<u64>>>()?,
            ),
            d if d.is_float() => {
                let v = items
                    .iter()
                    .map(|t| float(t).ok_or_else(|| bad(t)))
                    .collect::<Result<Vec<f64>>>()?;
                if d == DType::F64 {
                    Tensor::from_vec(&dims, v)
                } else {
                    // Parse as f32 first: the text holds the shortest f32 form, which rounds to the same f16/bf16.
                    Tensor::from_f64s(
                        d,
                        &dims,
                        &v.iter().map(|&x| x as f32 as f64).collect::<Vec<_>>(),
                    )
                }
            }
            d => {
                let v = items
                    .iter()
                    .map(|t| num(t).and_then(|s| s.parse::<i64>().ok()).ok_or_else(|| bad(t)))
                    .collect::<Result<Vec<i64>>>()?;
                Tensor::from_f64s(d, &dims, &v.iter().map(|&x| x as f64).collect::<Vec<_>>())
            }
        }
        .map_err(|e| err_at(&at, e.to_string()))
    }

    fn attr(&mut self) -> Result<Attr> {
        let at = self.here();
        match self.next()? {
            Tok::Str(s) => Ok(Attr::Str(s)),
            Tok::Num(n) => number_attr(&n).ok_or_else(|| err_at(&at, format!("bad number `{n}`"))),
            Tok::Word(w) if w == "nan" || w == "inf" => {
                Ok(Attr::Float(float(&Tok::Word(w)).expect("nan/inf parse") as f32))
            }
            Tok::Word(w) if w == "graph" => {
                self.pos -= 1;
                Ok(Attr::Graph(Subgraph(Arc::new(self.graph()?))))
            }
            Tok::Word(w) => match DType::from_name(&w) {
                // A dtype alone is a type attribute; one followed by a shape starts a tensor.
                Some(d) if self.peek() == Some(&Tok::Punct('[')) => {
                    self.pos -= 1;
                    let ty = self.tensor_type()?;
                    let _ = d;
                    Ok(Attr::Tensor(self.tensor_data(&ty)?))
                }
                Some(d) => Ok(Attr::Type(d)),
                None => Err(err_at(&at, format!("unexpected `{w}` in an attribute value"))),
            },
            Tok::Punct('[') => {
                let mut items = Vec::new();
                if !self.eat(']') {
                    loop {
                        items.push(self.next()?);
                        if self.eat(']') {
                            break;
                        }
                        self.expect(',')?;
                    }
                }
                if !items.is_empty() && items.iter().all(|t| matches!(t, Tok::Str(_))) {
                    return Ok(Attr::Strs(
                        items
                            .into_iter()
                            .map(|t| if let Tok::Str(s) = t { s } else { unreachable!() })
                            .collect(),
                    ));
                }
                let is_float = items.iter().any(|t| {
                    matches!(t, Tok::Num(n) if n.contains(['.', 'e', 'E']))
                        || matches!(t, Tok::Word(_))
                });
                if is_float {
                    items
                        .iter()
                        .map(|t| float(t).map(|v| v as f32))
                        .collect::<Option<Vec<f32>>>()
                        .map(Attr::Floats)
                } else {
                    items
                        .iter()
                        .map(|t| num(t).and_then(|s| s.parse().ok()))
                        .collect::<Option<Vec<i64>>>()
                        .map(Attr::Ints)
                }
                .ok_or_else(|| err_at(&at, "bad list"))
            }
            _ => Err(err_at(&at, "expected an attribute value")),
        }
    }
}

fn num(t: &Tok) -> Option<&str> {
    match t {
        Tok::Num(n) => Some(n),
        _ => None,
    }
}

fn float(t: &Tok) -> Option<f64> {
    match t {
        Tok::Num(n) if n == "-inf" => Some(f64::NEG_INFINITY),
        Tok::Num(n) => n.parse().ok(),
        Tok::Word(w) if w == "nan" => Some(f64::NAN),
        Tok::Word(w) if w == "inf" => Some(f64::INFINITY),
        _ => None,
    }
}

fn number_attr(n: &str) -> Option<Attr> {
    if n.contains(['.', 'e', 'E']) || n.ends_with("inf") {
        float(&Tok::Num(n.to_string())).map(|v| Attr::Float(v as f32))
    } else {
        n.parse().ok().map(Attr::Int)
    }
}
