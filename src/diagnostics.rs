//! Rendering errors for people: `file:line:col: error: message`, then the
//! offending source line with a caret under the column, the way rustc does.
//! Errors without a position print as `file: error: message`.

use weft_ir::{Diagnostic, IrError, Loc};

/// Renders one message at an optional position in `source`.
pub fn render(path: &str, source: &str, loc: Option<Loc>, message: &str) -> String {
    let Some(loc) = loc else {
        return format!("{path}: error: {message}\n");
    };
    let mut out = format!("{path}:{loc}: error: {message}\n");
    if let Some(line) = source.lines().nth(loc.line.saturating_sub(1) as usize) {
        let gutter = loc.line.to_string();
        let pad = " ".repeat(gutter.len());
        let caret_col = (loc.col.max(1) - 1) as usize;
        let prefix: String = line.chars().take(caret_col).map(|c| if c == '\t' { '\t' } else { ' ' }).collect();
        out.push_str(&format!("{pad} |\n{gutter} | {line}\n{pad} | {prefix}^\n"));
    }
    out
}

/// Renders a verifier diagnostic.
pub fn render_diagnostic(path: &str, source: &str, d: &Diagnostic) -> String {
    let mut msg = format!("in @{}: ", d.func);
    if !d.subject.is_empty() {
        msg.push_str(&d.subject);
        msg.push_str(": ");
    }
    msg.push_str(&d.message);
    render(path, source, d.loc, &msg)
}

/// Renders any IR error produced while handling `source` read from `path`.
pub fn render_ir_error(path: &str, source: &str, e: &IrError) -> String {
    match e {
        IrError::Parse(p) => render(path, source, Some(p.loc), &p.message),
        IrError::Verify(ds) => ds.iter().map(|d| render_diagnostic(path, source, d)).collect(),
        IrError::Interp(d) => render_diagnostic(path, source, d),
        other => render(path, source, None, &other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caret_under_column() {
        let src = "func @f() -> () {\n  %0 = bogus\n}\n";
        let s = render("a.weft", src, Some(Loc { line: 2, col: 8 }), "unknown op `bogus`");
        assert_eq!(s, "a.weft:2:8: error: unknown op `bogus`\n  |\n2 |   %0 = bogus\n  |        ^\n");
    }
}
