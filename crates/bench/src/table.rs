//! A minimal fixed-width table printer for experiment results.

/// Render rows under a header, each column as wide as its widest cell.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let line = |cells: &mut dyn Iterator<Item = &str>, out: &mut String| {
        let parts: Vec<String> = cells
            .zip(&widths)
            .map(|(c, w)| format!("{c:>w$}", w = *w))
            .collect();
        out.push_str(parts.join("  ").trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied(), &mut out);
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    out.push_str(&rule.join("  "));
    out.push('\n');
    for row in rows {
        line(&mut row.iter().map(String::as_str), &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_align() {
        let t = super::render(&["a", "bbb"], &[vec!["10".into(), "2".into()]]);
        assert_eq!(t, " a  bbb\n--  ---\n10    2\n");
    }
}
